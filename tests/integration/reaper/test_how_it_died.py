"""One scenario per row of the seed's "How it died" table (the orphan row is the sweeper's),
injected into a running control plane: every reaper net running together on a manual
clock, the real provisioner with its sim cloud, the scheduler's real WorkerService.

Each asserts that the named net catches the machine within its cadence plus its
threshold, that no other net acts on that machine, and what the ledger says.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpufleet.common.convert import composite_liveness
from gpufleet.provisioner.drivers.base import InstanceStatus
from gpufleet.scheduler.tick.decide import decide as plan_fleet
from gpufleet.scheduler.tick.decide import healthy
from gpufleet.scheduler.tick.model import CreateMachine, Policy
from gpufleet.scheduler.tick.snapshot import load_snapshot
from tests.integration.reaper.plane import Plane, running_plane

MINUTE = 60.0
CADENCE = 60.0


@pytest.fixture
def plane(pg_url: str) -> Iterator[Plane]:
    with running_plane(pg_url) as p:
        yield p


def _gone(plane: Plane, mid: str) -> bool:
    return plane.row(mid).state in ("DESTROYING", "DESTROYED")


def _scale_plan(plane: Plane) -> list[object]:
    with plane.sessions() as s:
        snapshot = load_snapshot(s, plane.clock.now(), 86400.0)
    return list(plan_fleet(snapshot, Policy(max_running_machines=8, worker_fresh_s=60.0)).scale)


def test_provisioning_stalls_before_the_machine_ever_registers(plane: Plane) -> None:
    """Nothing has gone stale — there is no report to age. The provision deadline catches it."""
    t0 = plane.clock.now()
    job = plane.queue_job()
    # As the scheduler leaves a machine whose create returned: BOOTING, deadline fixed at
    # request. Its agent never comes up and its worker never registers.
    mid = plane.machine(
        state="BOOTING",
        requested_at=t0,
        provision_deadline_at=t0 + timedelta(minutes=20),
        first_observed_at=t0,
        state_changed_at=t0,
    )
    plane.agents[mid].reachable = False
    plane.tick()
    assert _scale_plan(plane) == []  # the machine is arriving: no second one for the job

    caught = plane.run_until(lambda: _gone(plane, mid), within_s=20 * MINUTE + CADENCE)

    assert caught is not None and t0 + timedelta(minutes=20) <= caught <= t0 + timedelta(minutes=21)
    row = plane.row(mid)
    assert (row.state, row.intent) == ("DESTROYED", "DESTROYED")
    assert row.state_changed_by == "reaper"
    assert row.state_reason.startswith("destroy done; provision_deadline: ")
    assert plane.instance_status(mid) is None
    assert plane.provider_ops(mid) == ["destroy"]
    assert plane.ledger(mid) == [("provision_timeout", "provision_deadline", "REPLACE_MACHINE")]
    assert plane.acted(mid) == {"provision_deadline": {"destroy"}}
    # REPLACE_MACHINE: the job it was meant for is unmet demand again; the scale step
    # provisions a replacement.
    assert [type(a) for a in _scale_plan(plane)] == [CreateMachine]
    assert job  # still queued, waiting for the replacement


def test_the_instance_boots_but_its_start_up_never_completes(plane: Plane) -> None:
    """The provider reports a running instance, correctly. Boot failure catches it once its
    window has elapsed, after re-confirming the failure live across two ticks."""
    t0 = plane.clock.now()
    mid = plane.machine(
        state="BOOTING",
        requested_at=t0 - timedelta(minutes=1),
        provision_deadline_at=t0 + timedelta(minutes=19),
        first_observed_at=t0,
        state_changed_at=t0,
    )
    agent = plane.agents[mid]
    agent.quiet()
    agent.startup_complete = False
    agent.startup_error = "pipeline install: exit status 1"
    plane.tick()

    window = timedelta(minutes=30)
    assert plane.run_until(lambda: _gone(plane, mid), within_s=window.total_seconds() - 30) is None
    assert plane.instance_status(mid) is InstanceStatus.RUNNING
    caught = plane.run_until(lambda: _gone(plane, mid), within_s=2 * CADENCE + 30)

    # Window + the re-confirming tick (one cadence), plus the cadence the first look waits.
    assert caught is not None and caught <= t0 + window + timedelta(seconds=2 * CADENCE)
    assert plane.row(mid).state == "DESTROYED"
    assert plane.provider_ops(mid) == ["destroy"]
    assert plane.ledger(mid) == [("boot_failed", "boot_failure", "REPLACE_MACHINE")]
    assert plane.acted(mid) == {"boot_failure": {"startup_failure_seen", "destroy"}}
    assert agent.probe_calls == 2  # probed only once the window ran out: two ticks
    assert plane.refused(mid)["boot_failure"] == {"IN_GRACE_WINDOW"}


def test_the_worker_dies_while_the_instance_keeps_running(plane: Plane) -> None:
    """Every check that talks to the provider succeeds; the instance really is up. Went
    silent catches it — and only went silent."""
    mid = plane.machine()
    agent = plane.agents[mid]
    # Its runner is wedged holding the GPU: the agent answers, busy, every time.
    agent.busy(gpu=100.0, running=1)
    plane.reporting.add(mid)
    plane.tick()
    plane.step(30)
    assert plane.row(mid).worker_report_at == plane.clock.now()

    plane.reporting.discard(mid)  # the worker process dies
    died = plane.row(mid).worker_report_at
    assert died is not None
    assert plane.run_until(lambda: _gone(plane, mid), within_s=15 * MINUTE - 30) is None
    before = plane.row(mid)
    # Just before the net fires the other two channels are warm: a merged check sees life.
    assert before.provider_seen_at == plane.clock.now() and before.probe_ok_at == plane.clock.now()
    assert composite_liveness(before)[0] == plane.clock.now()
    caught = plane.run_until(lambda: _gone(plane, mid), within_s=CADENCE + 30)

    assert caught is not None and caught <= died + timedelta(minutes=15, seconds=CADENCE)
    assert plane.row(mid).state == "DESTROYED"
    assert plane.provider_ops(mid) == ["destroy"]
    assert plane.ledger(mid) == [("went_silent", "went_silent", "REPLACE_MACHINE")]
    assert plane.acted(mid) == {"went_silent": {"destroy"}}


def test_the_network_path_to_the_machine_drops(plane: Plane) -> None:
    """The machine may be healthy behind the break. The lost marker flags it and stops
    routing to it, and deliberately does not destroy — a day later it still runs."""
    mid = plane.machine()
    agent = plane.agents[mid]
    agent.quiet()
    plane.reporting.add(mid)  # its worker still reaches the scheduler
    agent.busy(requests=1)  # serving: the money chain leaves it alone
    plane.tick()
    t0 = plane.clock.now()
    agent.reachable = False  # the path from the control plane drops

    caught = plane.run_until(lambda: plane.row(mid).lost, within_s=3 * MINUTE + CADENCE)

    assert caught is not None and caught <= t0 + timedelta(minutes=3, seconds=CADENCE)
    assert plane.ledger(mid) == [("machine_lost", "lost_detector", "NOTHING")]
    with plane.sessions() as s:
        snapshot = load_snapshot(s, plane.clock.now(), 86400.0)
    [view] = [m for m in snapshot.machines if m.id == mid]
    assert not healthy(view, snapshot, Policy(max_running_machines=8, worker_fresh_s=60.0))

    for _ in range(24 * 3):  # a day, twenty minutes at a time
        plane.step(20 * MINUTE)
    row = plane.row(mid)
    assert (row.state, row.intent, row.lost) == ("READY", "RUNNING", True)
    assert plane.instance_status(mid) is InstanceStatus.RUNNING
    assert plane.provider_ops(mid) == []
    assert plane.ledger(mid) == [("machine_lost", "lost_detector", "NOTHING")]
    assert plane.acted(mid) == {"lost_detector": {"mark_lost"}}

    agent.reachable = True  # the path comes back
    plane.step(30)
    plane.step(30)
    assert plane.row(mid).lost is False
    assert plane.acted(mid) == {"lost_detector": {"mark_lost", "unmark_lost"}}
