"""The scheduler's agent clients follow its fleet: one per machine at its address, reused,
and closed once the machine is gone from the snapshot."""

from __future__ import annotations

from typing import Any

from gpufleet.common.clients.agent import AgentClients


class FakeClient:
    def __init__(self, machine_id: str, address: str) -> None:
        self.key = (machine_id, address)
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_clients_of_machines_gone_from_the_fleet_are_closed_and_the_rest_kept() -> None:
    made: list[FakeClient] = []

    def factory(machine_id: str, address: str) -> Any:
        made.append(FakeClient(machine_id, address))
        return made[-1]

    clients = AgentClients(factory)
    a, b = clients.get("m-a", "10.0.0.1:50060"), clients.get("m-b", "10.0.0.2:50060")
    assert clients.get("m-a", "10.0.0.1:50060") is a  # reused
    moved = clients.get("m-b", "10.0.0.9:50060")  # the same machine at a new address

    assert clients.retain({("m-a", "10.0.0.1:50060"), ("m-b", "10.0.0.9:50060")}) == 1
    assert b.closed and not a.closed and not moved.closed
    assert clients.has("m-a", "10.0.0.1:50060") and not clients.has("m-b", "10.0.0.2:50060")
    # Asked for again (a late cancel), a closed one is opened anew.
    again = clients.get("m-b", "10.0.0.2:50060")
    assert again is not b and len(made) == 4
    clients.close()
    assert all(c.closed for c in made)
