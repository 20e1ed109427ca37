"""A machine cordoned for a critical GPU fault is not capacity, from tables: the scale step
never starts it again as warm STOPPED capacity, never counts it as arriving or as warm, and
so asks for its replacement at once — within the ceilings, which it still fills while it
bills, until the reaper's gpu_fault net destroys it."""

from __future__ import annotations

from dataclasses import replace

from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.model import CreateMachine, FleetSnapshot, StartMachine
from tests.unit.scheduler.test_decide import POLICY, job, machine, snapshot


def warm(snap: FleetSnapshot, target: int) -> FleetSnapshot:
    return replace(snap, pools={"l4": replace(snap.pools["l4"], warm_target=target)})


def test_a_faulted_stopped_machine_is_never_started_for_work() -> None:
    faulted = machine("faulted", state="STOPPED", price=100_000, cordoned=True)
    plan = decide(snapshot(queued=[job("a")], machines=[faulted]), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]
    # The same machine, not cordoned, would have been started first: its disk is warm.
    plan = decide(snapshot(queued=[job("a")], machines=[replace(faulted, cordoned=False)]), POLICY)
    assert plan.scale == [StartMachine("faulted")]


def test_a_faulted_stopped_machine_is_never_started_to_keep_a_pool_warm() -> None:
    faulted = machine("faulted", state="STOPPED", price=100_000, cordoned=True)
    plan = decide(warm(snapshot(machines=[faulted]), target=1), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]


def test_a_faulted_running_machine_does_not_hold_the_warm_target() -> None:
    """Its replacement is asked for at once, not after the money chain stops it."""
    faulted = machine("faulted", cordoned=True)
    plan = decide(warm(snapshot(machines=[faulted]), target=1), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]
    assert [p.machine_id for p in plan.warm_pins if p.held] == []
    healthy = decide(warm(snapshot(machines=[replace(faulted, cordoned=False)]), target=1), POLICY)
    assert healthy.scale == []


def test_a_faulted_booting_machine_is_not_counted_as_arriving() -> None:
    faulted = machine("faulted", state="BOOTING", cordoned=True)
    plan = decide(snapshot(queued=[job("a"), job("b")], machines=[faulted]), POLICY)
    assert plan.scale == [CreateMachine("cheap", "l4")]


def test_its_jobs_go_to_a_replacement_and_never_to_it() -> None:
    faulted = machine("faulted", cordoned=True)
    plan = decide(snapshot(queued=[job("a")], machines=[faulted]), POLICY)
    assert plan.assignments == []
    assert plan.scale == [CreateMachine("cheap", "l4")]


def test_while_it_bills_it_still_fills_the_fleets_ceiling() -> None:
    """The ceiling caps what is billed: the replacement waits for the destroy to free room."""
    faulted = machine("faulted", cordoned=True)
    plan = decide(snapshot(queued=[job("a")], machines=[faulted]), replace(POLICY, max_running_machines=1))
    assert plan.scale == []
