"""A live look at a machine's start-up through its agent's ``Probe`` (for boot failure).

Called with no transaction open, with a short deadline; an agent that cannot be reached
answers ``None``, which the caller reads as "start-up not shown to be complete".
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.errors import GpufleetError
from gpufleet.common.trust.transport import Transport

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartupProbe:
    """What the agent says about the machine's start-up."""

    startup_complete: bool
    startup_error: str = ""
    worker_alive: bool = True

    @property
    def healthy(self) -> bool:
        return self.startup_complete and not self.startup_error and self.worker_alive


class AgentProber(Protocol):
    def probe(self, machine_id: str, address: str) -> StartupProbe | None:
        """The answer of the machine's agent at ``address`` (only that machine may answer),
        or None when it cannot be reached or answer in time."""
        ...


class GrpcAgentProber:
    """Probes an agent over gRPC through :class:`AgentClient` (a deadline on every call)."""

    def __init__(self, transport: Transport, timeout_s: float = 5.0) -> None:
        self.transport = transport
        self.timeout_s = timeout_s

    def probe(self, machine_id: str, address: str) -> StartupProbe | None:
        try:
            with AgentClient(machine_id, address, self.transport, timeout_s=self.timeout_s) as client:
                resp = client.probe()
        except GpufleetError as err:
            log.info("agent %s did not answer its probe: %s", address, err)
            return None
        except Exception:
            log.exception("unexpected error probing agent %s", address)
            return None
        return StartupProbe(
            startup_complete=resp.startup_complete,
            startup_error=resp.startup_error,
            worker_alive=resp.worker_alive,
        )


def probe_all(
    prober: AgentProber, agents: list[tuple[str, str | None]], concurrency: int
) -> list[StartupProbe | None]:
    """Probe every (machine id, agent address) in parallel (an absent address is an
    unreachable agent)."""
    if not agents:
        return []

    def one(agent: tuple[str, str | None]) -> StartupProbe | None:
        machine_id, address = agent
        return prober.probe(machine_id, address) if address else None

    with ThreadPoolExecutor(
        max_workers=min(max(1, concurrency), len(agents)), thread_name_prefix="probe"
    ) as pool:
        return list(pool.map(one, agents))
