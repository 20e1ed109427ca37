"""The money chain against the real ProvisionerService and its sim driver: the stop keeps
the instance (disk kept), the destroy removes it, and a typed provider error travels back
through the trailer into a STOPPING machine and a ledger row."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.models import Failure, Machine
from gpufleet.common.provider_errors import Transient
from gpufleet.provisioner.drivers.base import InstanceStatus
from tests.integration.reaper.conftest import Chain, wire_reaper
from tests.support.fleet_rows import add_machine, machine
from tests.support.scripted_services import serve_agent
from tests.support.sim_provisioner import SimProvisioner, serve_sim_provisioner


@pytest.fixture
def sim_chain(db_url: str) -> Iterator[Chain]:
    clock = ManualClock()
    with serve_sim_provisioner(clock) as sim, wire_reaper(db_url, clock, sim.address, sim) as c:
        c.heartbeats = True
        yield c


def test_stop_then_destroy_against_the_sim_cloud(sim_chain: Chain) -> None:
    sim: SimProvisioner = sim_chain.provisioner
    now = sim_chain.clock.now()
    with serve_agent() as agent:
        agent.quiet()
        mid = add_machine(sim_chain.sessions, now, id="m-sim-1", agent_address=agent.address)
        instance = sim.create(mid)
        with sim_chain.sessions() as s, s.begin():
            s.execute(
                update(Machine)
                .where(Machine.id == mid)
                .values(provider_instance_id=instance.provider_instance_id)
            )
        sim_chain.tick()
        sim_chain.step(5 * 60)  # stop falls due
        assert machine(sim_chain.sessions, mid).state == "STOPPED"
        stopped = sim.instance(mid)
        assert stopped is not None and stopped.status is InstanceStatus.STOPPED
        agent.reachable = False
        sim_chain.step(2 * 60 * 60)  # destroy falls due
    assert machine(sim_chain.sessions, mid).state == "DESTROYED"
    assert sim.instance(mid) is None
    assert [c.op for c in sim.cloud.calls] == ["create", "stop", "destroy"]


def test_a_typed_provider_error_leaves_stopping_and_a_ledger_row(sim_chain: Chain) -> None:
    sim: SimProvisioner = sim_chain.provisioner
    now = sim_chain.clock.now()
    mid = add_machine(sim_chain.sessions, now, id="m-sim-2", stop_due_at=now)
    sim.cloud.fail_next("stop", Transient("throttled"))
    sim_chain.tick()
    assert machine(sim_chain.sessions, mid).state == "STOPPING"
    with sim_chain.sessions() as s:
        [entry] = s.execute(select(Failure).where(Failure.machine_id == mid)).scalars().all()
    assert entry.detector == "auto_stop"
    assert "TRANSIENT" in entry.details and "throttled" in entry.details
