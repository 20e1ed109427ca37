"""Destroys against the clouds' timing (issue 27, item 3), on the GCE fake and on moto
through the real SDKs, driven by the reaper's own acting rung (``TransitionRunner``, as
every net that destroys uses it) and its stuck-transition net:

- a destroy is done only when the cloud confirms the instance gone: EC2 answers a
  terminate with shutting-down and finishes later, a GCE delete runs as an operation
  (the instance STOPPING meanwhile) — until then the machine stays DESTROYING, visible,
  and is read again (dstack #1551 marked such instances terminated while they billed);
- destroying an instance that is already gone is done, not stuck (dstack #3031);
- one machine's delete hanging at the cloud's API never delays another machine's
  reaping (karpenter #2077: eight idle GPU nodes kept for three weeks behind one stuck
  delete).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select

from gpufleet.common.convert import offering_to_proto
from gpufleet.common.db import models
from gpufleet.common.db.enums import MachineIntent, MachineState
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.refusal import MachineSnapshot
from gpufleet.reaper.snapshot import scan
from gpufleet.reaper.transition import Transition, TransitionRunner, destroy_transition
from tests.integration.clouds.clouds import GcpCloud, labelled
from tests.integration.clouds.world import DEPLOYMENT, POOL, World, offering_id
from tests.support.fleet_rows import add_machine
from tests.support.gce_fake import GceFake

NET = "auto_destroy"


@pytest.fixture
def gcp() -> Iterator[GcpCloud]:
    # A delete operation still running is given up on after one real second (production:
    # GPUFLEET_GCP_OPERATION_WAIT_S, 120): NotYetDone, as when GCE takes longer than that.
    with GceFake() as fake:
        yield GcpCloud(fake, operation_wait_s=1.0, operation_poll_s=0.2)


def running_machine(world: World) -> str:
    """A READY machine on the cloud's on-demand offering, its instance made through the
    provisioner as the scale step makes it; returns its id."""
    offering = offering_id(world.cloud, 1)
    machine_id = str(uuid.uuid4())
    with world.sessions() as s:
        row = s.get_one(models.Offering, offering)
        offering_msg = offering_to_proto(row)
        columns = {
            name: getattr(row, name)
            for name in (
                "provider",
                "region",
                "zone",
                "instance_type",
                "gpu_model",
                "gpu_count",
                "slots",
                "capacity_type",
                "hourly_price_micros",
            )
        }
    made = world.provisioner.create(machine_id, offering_msg, request_id=f"{machine_id}:create")
    now = world.clock.now()
    add_machine(
        world.sessions,
        now,
        id=machine_id,
        pool_id=POOL,
        offering_id=offering,
        provider_instance_id=made.provider_instance_id,
        state="READY",
        intent="RUNNING",
        requested_at=now - timedelta(hours=1),
        state_changed_at=now - timedelta(minutes=30),
        first_observed_at=now - timedelta(hours=1),
        **columns,
    )
    return machine_id


def snapshot(world: World, machine_id: str) -> MachineSnapshot:
    with world.sessions() as s:
        (machine,) = scan(s, [models.Machine.id == machine_id])
    return machine


def runner(world: World) -> TransitionRunner:
    """The reaper's acting rung, on the provider-call pool its stuck-transition net shares
    (as the reaper wires every net to one pool)."""
    assert world.reaper_lease.try_acquire()
    pool = world.stuck_transition.calls
    return TransitionRunner(world.sessions, world.reaper_lease, world.clock, calls=pool)


def act(world: World, rung: TransitionRunner, transition: Transition, machine_id: str) -> None:
    call = world.provisioner.destroy if transition.operation == "destroy" else world.provisioner.stop
    claimed = rung.execute(
        transition,
        snapshot(world, machine_id),
        world.clock.now(),
        DecisionLog(NET),
        guards=[],
        call=call,
        why="idle past its destroy timer",
    )
    assert claimed


def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Whether ``condition`` holds within ``timeout_s`` real seconds (a bound, not a timing)."""
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.05)):
        if condition():
            return True
        pause.wait(0.05)
    return condition()


def state(world: World, machine_id: str) -> str:
    return world.machine(machine_id).state


def test_a_destroy_is_done_only_when_the_cloud_says_the_instance_is_gone(world: World) -> None:
    machine_id = running_machine(world)
    world.cloud.end_slowly()
    rung = runner(world)

    act(world, rung, destroy_transition(NET), machine_id)
    assert rung.calls.wait_idle(30)

    # The cloud accepted the delete and still shows the instance: not destroyed yet.
    (ending,) = labelled(world.cloud, machine_id)
    assert ending.status in {"shutting-down", "STOPPING"}
    machine = world.machine(machine_id)
    assert (machine.state, machine.intent) == ("DESTROYING", MachineIntent.DESTROYED.value)
    assert rung.answered().actions["destroy_unconfirmed"] == 1
    (row,) = world.failures("destroy_unconfirmed")
    assert (row.machine_id, row.detector, row.outcome) == (machine_id, NET, "NOTHING")
    assert "still" in row.details  # EC2: "still shows ... shutting-down"; GCE: its delete "still RUNNING"
    # A cloud that takes its time is no failure: nothing for a human yet.
    assert world.failures("provider_call_failed") == [] and world.incidents() == []

    # The stuck-transition net reads it again on its next pass — long before its own
    # stuck limit — and leaves it DESTROYING while the cloud still shows it.
    world.advance(60)
    report = world.reap_stuck()
    assert report.actions["destroy_awaiting_confirmation"] == 1
    assert state(world, machine_id) == "DESTROYING"

    world.cloud.finish_ending()
    assert labelled(world.cloud, machine_id) == []
    world.advance(60)
    report = world.reap_stuck()

    assert report.actions["finish"] == 1
    machine = world.machine(machine_id)
    assert (machine.state, machine.state_changed_by) == ("DESTROYED", "reaper")
    assert world.incidents() == []


def test_destroying_an_instance_already_gone_is_done_not_stuck(world: World) -> None:
    machine_id = running_machine(world)
    world.cloud.vanish(machine_id)  # deleted at the console, or taken back, before we got to it
    rung = runner(world)

    act(world, rung, destroy_transition(NET), machine_id)
    assert rung.calls.wait_idle(30)

    assert rung.answered().actions["destroy"] == 1
    assert state(world, machine_id) == "DESTROYED"
    assert world.failures() == [] and world.incidents() == []


def test_one_stuck_delete_never_delays_another_machines_reaping(world: World) -> None:
    stuck, other, third = (running_machine(world) for _ in range(3))
    world.cloud.hold_destroy(stuck)
    rung = runner(world)
    stop = Transition(
        operation="stop",
        detector="auto_stop",
        intent=MachineIntent.STOPPED,
        transitional=MachineState.STOPPING,
        end=MachineState.STOPPED,
    )

    act(world, rung, destroy_transition(NET), stuck)
    act(world, rung, destroy_transition(NET), other)
    act(world, rung, stop, third)

    # The other destroy and the stop finish while the stuck delete still hangs at the API.
    def settled() -> bool:
        with world.sessions() as s:
            states = dict(
                s.execute(
                    select(models.Machine.id, models.Machine.state).where(
                        models.Machine.id.in_([other, third])
                    )
                ).all()
            )
        return states == {other: "DESTROYED", third: "STOPPED"}

    try:
        assert until(settled), "another machine's destroy or stop waited behind the stuck delete"
        assert labelled(world.cloud, other) == []
        assert state(world, stuck) == "DESTROYING"
        assert rung.calls.busy(stuck), "the stuck delete should still be out"
        # The stuck-transition net leaves a call still in flight to that call.
        world.advance(3600)
        assert world.reap_stuck().actions["call_in_flight"] == 1
    finally:
        world.cloud.release_destroys()

    assert rung.calls.wait_idle(30)
    assert state(world, stuck) == "DESTROYED"
    assert labelled(world.cloud, stuck) == []


def test_an_orphans_destroy_awaits_the_clouds_confirmation_without_an_incident(world: World) -> None:
    """The orphan sweep's destroy goes through the same drivers: one the cloud accepted but
    still shows is no failure (no incident); the next sweep finds it gone."""
    world.cloud.end_slowly()
    orphan = str(uuid.uuid4())
    instance_id = world.cloud.plant(orphan, DEPLOYMENT, world.cloud.zones[0])
    assert world.orphan_sweep().actions["orphan_destroyed"] == 0  # first seen: its grace begins
    launched = world.launch_time(instance_id)
    world.advance_to(max(launched, world.clock.now()) + timedelta(minutes=31))

    report = world.orphan_sweep()

    assert report.actions["orphan_destroyed"] == 0
    (row,) = world.failures("destroy_unconfirmed")
    assert (row.detector, row.outcome) == ("orphan_sweep", "NOTHING")
    assert world.failures("provider_call_failed") == [] and world.incidents() == []
    assert world.orphans()[instance_id].action == "DESTROYING"

    world.cloud.finish_ending()
    world.advance(300)
    world.orphan_sweep()

    assert labelled(world.cloud, orphan) == []
    assert world.orphans()[instance_id].action in {"GONE", "DESTROYED"}
    assert world.incidents() == []
