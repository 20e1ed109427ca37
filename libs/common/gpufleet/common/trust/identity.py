"""Who is calling: a role, and for a machine its id, read from the certificate's URI SAN.

An identity is ``spiffe://gpufleet.<deployment>/<role>`` or, for a machine,
``spiffe://gpufleet.<deployment>/machine/<machine_id>``. It is never taken from a request
field: only a certificate the deployment's CA signed can name one.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

SCHEME = "spiffe://"
# Machine ids are ours (uuid hex) or an operator's name for a registered box.
MACHINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
DEPLOYMENT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class Role(enum.StrEnum):
    """The parts of a deployment, each with its own certificate."""

    SCHEDULER = "scheduler"
    REAPER = "reaper"
    SWEEPER = "sweeper"
    PROVISIONER = "provisioner"
    MACHINE = "machine"
    BACKEND = "backend"
    OPERATOR = "operator"
    # The model gateway and the voice service: they only ask TokenService about a token.
    GATEWAY = "gateway"
    # The OpenTelemetry collector: it receives every part's traces and metrics and calls
    # nothing of gpufleet's; its certificate is what an exporter checks before sending.
    COLLECTOR = "collector"
    # The metrics scraper (Prometheus): the only identity a part's metrics listener answers
    # (gpufleet.common.metrics_listener); it calls nothing of gpufleet's gRPC API.
    METRICS = "metrics"


SERVICE_ROLES = frozenset(r for r in Role if r is not Role.MACHINE)


@dataclass(frozen=True)
class Identity:
    role: Role
    deployment: str
    machine_id: str | None = None

    def __post_init__(self) -> None:
        if (self.role is Role.MACHINE) != (self.machine_id is not None):
            raise ValueError("a machine identity, and only one, names its machine id")
        if self.machine_id is not None and not MACHINE_ID.match(self.machine_id):
            raise ValueError(f"not a machine id: {self.machine_id!r}")
        if not DEPLOYMENT.match(self.deployment):
            raise ValueError(f"not a deployment id: {self.deployment!r}")

    @property
    def uri(self) -> str:
        tail = f"machine/{self.machine_id}" if self.role is Role.MACHINE else self.role.value
        return f"{SCHEME}gpufleet.{self.deployment}/{tail}"

    @property
    def server_name(self) -> str:
        """The DNS name a client checks on this part's serving certificate: a client that
        dials the provisioner is answered by a provisioner, one that dials a machine's agent
        by that machine — whatever address it dialled."""
        if self.role is Role.MACHINE:
            return f"{self.machine_id}.machine.gpufleet.{self.deployment}"
        return f"{self.role.value}.gpufleet.{self.deployment}"

    @property
    def server_names(self) -> list[str]:
        """Every DNS name this part's certificate carries: its own only. A machine's names
        its machine, and no name is shared by every machine: a caller dials one machine and
        only that one may answer."""
        return [self.server_name]

    def __str__(self) -> str:
        return f"machine:{self.machine_id}" if self.role is Role.MACHINE else self.role.value

    @classmethod
    def parse_uri(cls, uri: str) -> Identity | None:
        """The identity a URI SAN names, or None when it names none of ours."""
        if not uri.startswith(SCHEME + "gpufleet."):
            return None
        host, _, path = uri[len(SCHEME) + len("gpufleet.") :].partition("/")
        parts = path.split("/")
        try:
            if len(parts) == 2 and parts[0] == Role.MACHINE.value:
                return cls(Role.MACHINE, host, parts[1])
            if len(parts) == 1 and parts[0] in SERVICE_ROLES:
                return cls(Role(parts[0]), host)
        except ValueError:
            return None
        return None

    @classmethod
    def parse(cls, text: str, deployment: str) -> Identity:
        """``scheduler``, ``machine:<id>``: how an operator names one on the command line."""
        role, _, machine_id = text.partition(":")
        try:
            parsed = Role(role)
        except ValueError:
            raise ValueError(f"unknown role {role!r}: one of {', '.join(r.value for r in Role)}") from None
        return cls(parsed, deployment, machine_id or None)
