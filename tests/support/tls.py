"""The tests' own certificate authorities: one per deployment id, made once per test run.

Every process a test starts, and every server it builds in-process, runs with mutual TLS
like a deployment; a test calls as the role it plays (an operator, a backend, a machine)
with :func:`channel`.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

import grpc

from gpufleet.common import grpcclient
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, MachineIssuer, TlsFiles
from gpufleet.common.trust.transport import Transport

DEFAULT_DEPLOYMENT = "local"
# One set of CAs for a test run and every process it starts (a benchmark's worker processes
# import this module again): the first process makes the folder and hands it down.
_ROOT_ENV = "GPUFLEET_TEST_CA_ROOT"
if os.environ.get(_ROOT_ENV):
    _root = Path(os.environ[_ROOT_ENV])
else:
    _root = Path(tempfile.mkdtemp(prefix="gpufleet-test-ca-"))
    os.environ[_ROOT_ENV] = str(_root)
    _owner = os.getpid()

    def _remove_root() -> None:
        # Only the process that made the folder removes it (its children inherit the hook).
        if os.getpid() == _owner:
            shutil.rmtree(_root, True)

    atexit.register(_remove_root)
_lock = threading.Lock()
_authorities: dict[str, Authority] = {}


@contextlib.contextmanager
def _across_processes() -> Iterator[None]:
    """Several processes of one run may make the same CA or certificate at once."""
    with _lock, open(_root / ".lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def authority(deployment: str = DEFAULT_DEPLOYMENT) -> Authority:
    with _across_processes():
        found = _authorities.get(deployment)
        if found is None:
            found = _authorities[deployment] = Authority.ensure(_root / deployment, deployment)
        return found


def identity(who: str | Role, deployment: str = DEFAULT_DEPLOYMENT) -> Identity:
    """``"scheduler"``, ``Role.OPERATOR`` or ``"machine:<id>"``."""
    return Identity.parse(who.value if isinstance(who, Role) else who, deployment)


def files(who: str | Role, deployment: str = DEFAULT_DEPLOYMENT) -> TlsFiles:
    ident = identity(who, deployment)
    with _across_processes():
        return _ensure(ident)


def _ensure(ident: Identity, name: str | None = None) -> TlsFiles:
    auth = _authorities.get(ident.deployment)
    if auth is None:
        auth = _authorities[ident.deployment] = Authority.ensure(_root / ident.deployment, ident.deployment)
    return auth.ensure_part(ident, name)


def env(who: str | Role, deployment: str = DEFAULT_DEPLOYMENT) -> dict[str, str]:
    """The environment that makes a process ``who`` (its certificate, the trust bundle);
    the provisioner also gets the machine CA, to give local machines their own."""
    f = files(who, deployment)
    out = {
        "GPUFLEET_DEPLOYMENT_ID": deployment,
        "GPUFLEET_TLS_CA_FILE": str(f.ca),
        "GPUFLEET_TLS_CERT_FILE": str(f.cert),
        "GPUFLEET_TLS_KEY_FILE": str(f.key),
    }
    if identity(who, deployment).role is Role.PROVISIONER:
        folder = authority(deployment).folder
        out["GPUFLEET_TLS_MACHINE_CA_CERT_FILE"] = str(folder / "machine-ca.crt")
        out["GPUFLEET_TLS_MACHINE_CA_KEY_FILE"] = str(folder / "machine-ca.key")
    return out


class _StandIn(Identity):
    """A machine identity whose certificate answers to every machine's name: the tests'
    scripted agent stands in for whichever machines a test registers at its address. No
    part of gpufleet issues such a certificate (each machine's names only itself)."""

    @property
    def server_names(self) -> list[str]:
        return [f"*.machine.gpufleet.{self.deployment}"]


def stand_in_agent_transport(deployment: str = DEFAULT_DEPLOYMENT) -> Transport:
    """The serving credential of a scripted agent that answers for any machine id."""
    ident = _StandIn(Role.MACHINE, deployment, "scripted-agent")
    with _across_processes():
        return Transport(deployment, _ensure(ident, name="scripted-agent-stand-in"))


class TlsSettings(TypedDict):
    """The fields of a service's ``Settings`` that :func:`settings` fills (``**``-unpacked,
    each is checked against the field of the same name)."""

    deployment_id: str
    tls_ca_file: str
    tls_cert_file: str
    tls_key_file: str


def settings(who: str | Role, deployment: str = DEFAULT_DEPLOYMENT) -> TlsSettings:
    """Keyword arguments for a service's ``Settings`` built in-process."""
    f = files(who, deployment)
    return {
        "deployment_id": deployment,
        "tls_ca_file": str(f.ca),
        "tls_cert_file": str(f.cert),
        "tls_key_file": str(f.key),
    }


def transport(who: str | Role, deployment: str = DEFAULT_DEPLOYMENT) -> Transport:
    return Transport(deployment, files(who, deployment))


def channel(
    address: str,
    server: Role,
    *,
    who: str | Role = Role.OPERATOR,
    deployment: str = DEFAULT_DEPLOYMENT,
    options: list[tuple[str, object]] | None = None,
    machine_id: str | None = None,
) -> grpc.Channel:
    """A channel to the part ``server`` at ``address``, calling as ``who``."""
    t = transport(who, deployment)
    return t.channel(address, t.server_name(server, machine_id), options)


def open_channel(address: str, server: Role, who: str | Role = Role.OPERATOR) -> grpc.Channel:
    """The same with trace propagation, as the services' own clients open them."""
    return grpcclient.open_channel(address, transport(who), server)


def machine_issuer(deployment: str = DEFAULT_DEPLOYMENT) -> MachineIssuer:
    """What the provisioner's drivers give new machines their certificates with."""
    auth = authority(deployment)
    return MachineIssuer.load(
        auth.ca_path, auth.folder / "machine-ca.crt", auth.folder / "machine-ca.key", deployment
    )


class AsNamedMachine:
    """A WorkerService stub that makes each call as the machine its request names — what
    an honest machine's worker does — over one channel per machine, kept until
    :meth:`close`. ``who`` fixes the caller instead (a machine reporting for another)."""

    def __init__(self, address: str, stub_class: type, deployment: str = DEFAULT_DEPLOYMENT) -> None:
        self.address, self.stub_class, self.deployment = address, stub_class, deployment
        self._stubs: dict[str, object] = {}
        self._channels: list[grpc.Channel] = []
        self._lock = threading.Lock()

    def as_machine(self, machine_id: str) -> Any:
        with self._lock:
            stub = self._stubs.get(machine_id)
            if stub is None:
                ch = channel(
                    self.address, Role.SCHEDULER, who=f"machine:{machine_id}", deployment=self.deployment
                )
                self._channels.append(ch)
                stub = self._stubs[machine_id] = self.stub_class(ch)
            return stub

    def __getattr__(self, method: str) -> Any:
        def call(request: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.as_machine(request.machine_id), method)(request, *args, **kwargs)

        return call

    def close(self) -> None:
        for ch in self._channels:
            ch.close()
