"""Inventory reconcile against the real ProvisionerService and its sim driver."""

from __future__ import annotations

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from tests.support import tls
from tests.support.fleet_rows import add_machine, machine
from tests.support.sim_provisioner import serve_sim_provisioner


def test_reconcile_reads_the_sim_clouds_list(db_url: str) -> None:
    clock = ManualClock()
    sessions = make_sessionmaker(make_engine(db_url))
    now = clock.now()
    with serve_sim_provisioner(clock) as sim:
        running = add_machine(sessions, now, id="m-run", provider_instance_id=None)
        kept_stopped = add_machine(
            sessions, now, id="m-stop", provider_instance_id=None, state="STOPPED", intent="STOPPED"
        )
        sim.create(running)
        sim.create(kept_stopped)  # the provider still runs it; our intent is STOPPED
        client = ProvisionerClient(sim.address, tls.transport("sweeper"), timeout_s=5)
        try:
            result = InventoryReconcile(sessions, client).reconcile(now, lease=None)
        finally:
            client.close()
        assert [c.op for c in sim.cloud.calls] == ["create", "create", "list"]  # nothing started or stopped
    assert (result.instances_seen, result.machines_updated, result.unreachable) == (2, 1, [])
    assert machine(sessions, running).provider_seen_at == now
    stopped = machine(sessions, kept_stopped)
    assert (stopped.provider_seen_at, stopped.state, stopped.intent) == (None, "STOPPED", "STOPPED")
