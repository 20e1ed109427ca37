"""Inventory reconcile against the provider's list (DESIGN §3, §4), on both stores."""

from __future__ import annotations

from datetime import timedelta

from gpufleet.v1 import machine_pb2, provisioner_service_pb2
from tests.integration.sweeper.conftest import Sweep
from tests.support.fleet_rows import add_machine, machine


def test_writes_the_provider_channel_only_for_intent_running(sweep: Sweep) -> None:
    now = sweep.clock.now()
    running = add_machine(sweep.sessions, now)
    stopped = add_machine(sweep.sessions, now, state="STOPPED", intent="STOPPED")
    stopping = add_machine(sweep.sessions, now, state="STOPPING", intent="STOPPED")
    registered = add_machine(sweep.sessions, now, origin="REGISTERED")
    destroyed = add_machine(sweep.sessions, now, state="DESTROYED", intent="DESTROYED")
    for mid in (running, stopped, stopping, registered, destroyed):
        # The provider still lists every one of them as running.
        sweep.provisioner.list_instance(mid, machine(sweep.sessions, mid).provider_instance_id or "")
    sweep.tick()
    assert machine(sweep.sessions, running).provider_seen_at == now
    for mid in (stopped, stopping, registered, destroyed):
        row = machine(sweep.sessions, mid)
        assert row.provider_seen_at is None
    # A deliberate stop is left alone: nothing is started, no state or intent changes.
    assert (machine(sweep.sessions, stopped).state, machine(sweep.sessions, stopped).intent) == (
        "STOPPED",
        "STOPPED",
    )
    # Only lists (the reconcile's and the orphan sweep's): nothing started, stopped or destroyed.
    assert {c.op for c in sweep.provisioner.ops()} == {"list"}
    sweep.step(60)
    assert machine(sweep.sessions, running).provider_seen_at == sweep.clock.now()
    assert machine(sweep.sessions, stopped).provider_seen_at is None


def test_matches_by_label_and_ignores_instances_not_running(sweep: Sweep) -> None:
    now = sweep.clock.now()
    by_label = add_machine(
        sweep.sessions, now, provider_instance_id=None, state="PROVISIONING", first_observed_at=None
    )
    pending = add_machine(sweep.sessions, now)
    sweep.provisioner.list_instance(by_label, "sim-new")
    sweep.provisioner.list_instance(
        pending,
        machine(sweep.sessions, pending).provider_instance_id or "",
        status=provisioner_service_pb2.INSTANCE_STATUS_PENDING,
    )
    sweep.tick()
    seen = machine(sweep.sessions, by_label)
    assert (seen.provider_seen_at, seen.first_observed_at) == (now, now)
    assert machine(sweep.sessions, pending).provider_seen_at is None


def test_an_unreachable_provider_changes_nothing_for_its_machines(sweep: Sweep) -> None:
    now = sweep.clock.now()
    earlier = now - timedelta(minutes=3)
    sim = add_machine(sweep.sessions, now, provider_seen_at=earlier)
    aws = add_machine(sweep.sessions, now, provider="AWS", provider_instance_id="i-0abc")
    sweep.provisioner.list_instance(aws, "i-0abc", provider=machine_pb2.PROVIDER_AWS)
    sweep.provisioner.unreachable = [machine_pb2.PROVIDER_SIM]
    sweep.tick()
    assert machine(sweep.sessions, sim).provider_seen_at == earlier
    assert machine(sweep.sessions, aws).provider_seen_at == now
    [row] = sweep.sweep_rows("INVENTORY_RECONCILE")
    assert (row.kind, row.instances_seen, row.machines_updated, row.unreachable) == (
        "INVENTORY_RECONCILE",
        1,
        1,
        ["SIM"],
    )


def test_a_provisioner_that_cannot_list_changes_nothing(sweep: Sweep) -> None:
    now = sweep.clock.now()
    mid = add_machine(sweep.sessions, now)
    sweep.provisioner.list_instance(mid, machine(sweep.sessions, mid).provider_instance_id or "")
    sweep.provisioner.fail_next("list", "AUTH_FAILED")
    sweep.tick()
    assert machine(sweep.sessions, mid).provider_seen_at is None
    [row] = sweep.sweep_rows("INVENTORY_RECONCILE")
    assert "could not list" in row.summary


def test_a_late_write_never_moves_the_channel_backwards(sweep: Sweep) -> None:
    now = sweep.clock.now()
    mid = add_machine(sweep.sessions, now, provider_seen_at=now + timedelta(minutes=1))
    sweep.provisioner.list_instance(mid, machine(sweep.sessions, mid).provider_instance_id or "")
    result = sweep.reconcile.reconcile(now, lease=None)  # a pass that read its list a minute ago
    assert result.machines_updated == 0
    assert machine(sweep.sessions, mid).provider_seen_at == now + timedelta(minutes=1)
