"""The reverse of the scenarios: one machine per refusal, each baited so that a net would
act on it but for one gate, survives every net running together — and the refusal is
recorded with its reason (decision log, ListWatchdogs counts).

A destroyed row is not refused one by one: every scan excludes it in SQL, so it never
reaches a gate at all (``test_destroyed_rows``). What is refused by name is the race —
a row destroyed between a net's scan and its claiming write (``CHANGED_SINCE_SCAN``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.db.models import Machine
from gpufleet.common.ledger import OutcomePolicy
from gpufleet.provisioner.drivers.base import InstanceStatus
from gpufleet.reaper.agent_probe import GrpcAgentProber
from gpufleet.reaper.boot_failure import BootFailure, BootFailurePolicy
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.provision_deadline import ProvisionDeadline, ProvisionDeadlinePolicy
from gpufleet.reaper.went_silent import WentSilent, WentSilentPolicy
from tests.integration.reaper.plane import Plane, running_plane
from tests.support import tls
from tests.support.fleet_rows import add_attempt

MINUTE = 60.0


@pytest.fixture
def plane(pg_url: str) -> Iterator[Plane]:
    with running_plane(pg_url) as p:
        yield p


def _survives(plane: Plane, mid: str, state: str = "READY") -> None:
    row = plane.row(mid)
    assert (row.state, row.intent, row.lost) == (state, "RUNNING", False)
    assert plane.instance_status(mid) is InstanceStatus.RUNNING
    assert plane.provider_ops(mid) == []
    assert plane.ledger(mid) == []
    assert plane.acted(mid) == {}


def _silent_and_due(plane: Plane) -> dict[str, Any]:
    """What would get a machine stopped, destroyed and reaped as silent, but for a gate."""
    now = plane.clock.now()
    return dict(
        worker_report_at=now - timedelta(hours=1),
        stop_due_at=now - timedelta(seconds=1),
        destroy_due_at=now - timedelta(seconds=1),
    )


def test_a_pinned_machine_survives_every_net(plane: Plane) -> None:
    mid = plane.machine(agent=False, **_silent_and_due(plane))
    add_attempt(plane.sessions, plane.clock.now(), mid)  # its lease is never checked here
    plane.tick()
    for _ in range(40):
        plane.step(MINUTE)
    _survives(plane, mid)
    assert plane.refused(mid) == {
        "auto_stop": {"WORK_PINNED"},
        "auto_destroy": {"WORK_PINNED"},
        "went_silent": {"WORK_PINNED"},
    }
    assert plane.stats("went_silent").refusals == {"WORK_PINNED": 41}


def test_an_exempt_class_survives_the_report_reading_nets(plane: Plane) -> None:
    """Exempt by class, not by a longer timeout: it is refused on every tick, for ever."""
    never = plane.machine(agent=False, workload_class="SILENT")
    once = plane.machine(
        agent=False, workload_class="SILENT", worker_report_at=plane.clock.now() - timedelta(hours=1)
    )
    plane.tick()
    for _ in range(40):
        plane.step(MINUTE)
    _survives(plane, never)
    _survives(plane, once)
    assert plane.refused(never) == {"boot_failure": {"EXEMPT_CLASS"}}
    assert plane.refused(once) == {"went_silent": {"EXEMPT_CLASS"}}
    assert plane.stats("boot_failure").refusals == {"EXEMPT_CLASS": 41}


def test_a_self_registered_box_is_observed_never_stopped_or_destroyed(plane: Plane) -> None:
    registered: dict[str, Any] = dict(origin="REGISTERED", managed=False, instance=False, agent=False)
    silent = plane.machine(**registered, **_silent_and_due(plane))
    never = plane.machine(**registered)
    plane.tick()
    for _ in range(40):
        plane.step(MINUTE)
    for mid in (silent, never):
        row = plane.row(mid)
        assert (row.state, row.intent, row.lost) == ("READY", "RUNNING", False)
        assert plane.provider_ops(mid) == [] and plane.ledger(mid) == [] and plane.acted(mid) == {}
    assert plane.refused(silent) == {
        "auto_stop": {"NOT_OURS"},
        "auto_destroy": {"NOT_OURS"},
        "went_silent": {"NOT_OURS"},
    }
    assert plane.refused(never) == {"boot_failure": {"NOT_OURS"}}


def test_a_machine_inside_its_grace_window_survives(plane: Plane) -> None:
    """Started a minute ago, never reported since, timers due: the windows count from first
    observation, so nothing acts while it may still be pulling its image."""
    now = plane.clock.now()
    mid = plane.machine(
        agent=False,
        first_observed_at=now - timedelta(minutes=1),
        state_changed_at=now - timedelta(minutes=1),
        stop_due_at=now - timedelta(seconds=1),
        destroy_due_at=now - timedelta(seconds=1),
    )
    plane.tick()
    for _ in range(8):  # still inside the money chain's 10 minutes and the 30-minute boot window
        plane.step(MINUTE)
    _survives(plane, mid)
    assert plane.refused(mid) == {
        "auto_stop": {"IN_GRACE_WINDOW"},
        "auto_destroy": {"IN_GRACE_WINDOW"},
        "boot_failure": {"IN_GRACE_WINDOW"},
    }


def test_a_row_destroyed_between_scan_and_claim_is_refused_not_called(plane: Plane) -> None:
    now = plane.clock.now()
    lease = plane.lease
    assert lease.try_acquire()
    silent = plane.machine(worker_report_at=now - timedelta(hours=1))
    stalled = plane.machine(
        state="BOOTING",
        requested_at=now - timedelta(minutes=30),
        provision_deadline_at=now - timedelta(minutes=10),
        first_observed_at=now - timedelta(minutes=29),
    )
    unreported = plane.machine(
        first_observed_at=now - timedelta(hours=1), startup_failed_at=now - timedelta(minutes=1)
    )
    plane.agents[unreported].startup_complete = False
    client = ProvisionerClient(plane.sim.address, tls.transport("reaper"), timeout_s=5.0)
    plane.stack.callback(client.close)
    nets: list[tuple[WentSilent | ProvisionDeadline | BootFailure, str]] = [
        (WentSilent(plane.sessions, lease, plane.clock, client, WentSilentPolicy(), OutcomePolicy()), silent),
        (
            ProvisionDeadline(
                plane.sessions, lease, plane.clock, client, ProvisionDeadlinePolicy(), OutcomePolicy()
            ),
            stalled,
        ),
        (
            BootFailure(
                plane.sessions, lease, plane.clock, client, GrpcAgentProber(2.0), BootFailurePolicy()
            ),
            unreported,
        ),
    ]
    for net, mid in nets:
        [seen] = net.scan(now)
        assert seen.machine_id == mid
        with plane.sessions() as s, s.begin():
            s.execute(update(Machine).where(Machine.id == mid).values(state="DESTROYED", intent="DESTROYED"))
        decisions = DecisionLog(net.name)
        net.act(now, [seen], decisions)
        assert dict(decisions.report.refusals) == {"CHANGED_SINCE_SCAN": 1}, net.name
        assert dict(decisions.report.actions) == {}, net.name
        assert plane.provider_ops(mid) == [] and plane.ledger(mid) == []
