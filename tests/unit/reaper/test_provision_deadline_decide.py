"""Provision deadline's decision, from a table: no contact by the deadline fixed at request."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.reaper.provision_deadline import DestroyMachine, ProvisionDeadlinePolicy, decide
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = ProvisionDeadlinePolicy(default_deadline=timedelta(minutes=20))

# Created 21 minutes ago, deadline a minute ago; never heard from.
STALLED = replace(
    HEALTHY,
    state="BOOTING",
    requested_at=ago(minutes=21),
    provision_deadline_at=ago(minutes=1),
    first_observed_at=ago(minutes=20),
    probe_ok_at=None,
    probe_failed_since=ago(minutes=20),
    worker_report_at=None,
    provider_seen_at=ago(seconds=30),
)

DESTROY = "destroy"
CASES: list[tuple[str, MachineSnapshot, object]] = [
    ("booting, never contacted, past the deadline", STALLED, DESTROY),
    ("exactly at the deadline", replace(STALLED, provision_deadline_at=NOW), DESTROY),
    (
        "a second before the deadline",
        replace(STALLED, provision_deadline_at=NOW + timedelta(seconds=1)),
        None,
    ),
    (
        "create never answered (PROVISIONING)",
        replace(STALLED, state="PROVISIONING", first_observed_at=None),
        DESTROY,
    ),
    ("its agent answered once: boot failure's, not ours", replace(STALLED, probe_ok_at=ago(minutes=5)), None),
    ("its worker reported once", replace(STALLED, worker_report_at=ago(minutes=5)), None),
    ("ready machines are never this net's", replace(STALLED, state="READY"), None),
    ("stopped machines are never this net's", replace(STALLED, state="STOPPED"), None),
    (
        "no deadline recorded: requested_at plus the default",
        replace(STALLED, provision_deadline_at=None, requested_at=ago(minutes=20)),
        DESTROY,
    ),
    (
        "no deadline recorded, inside the default",
        replace(STALLED, provision_deadline_at=None, requested_at=ago(minutes=19)),
        None,
    ),
    (
        "no deadline and no request time",
        replace(STALLED, provision_deadline_at=None, requested_at=None),
        None,
    ),
    # The deadline runs from the request, so no grace window from first observation.
    ("never observed is no refusal here", replace(STALLED, first_observed_at=None), DESTROY),
    # It does not read reports: an exempt class that never made contact is stalled too.
    ("exempt class", replace(STALLED, workload_class="SILENT"), DESTROY),
    ("registered box", replace(STALLED, origin="REGISTERED"), Refuse(RefusalReason.NOT_OURS)),
    ("not managed", replace(STALLED, managed=False), Refuse(RefusalReason.NOT_OURS)),
]


@pytest.mark.parametrize(("machine", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(machine: MachineSnapshot, expected: object) -> None:
    decision = decide(NOW, machine, POLICY)
    if expected == DESTROY:
        assert isinstance(decision, DestroyMachine) and decision.machine_id == machine.machine_id
    else:
        assert decision == expected


def test_the_ledger_details_name_the_deadline() -> None:
    decision = decide(NOW, STALLED, POLICY)
    assert isinstance(decision, DestroyMachine)
    assert STALLED.provision_deadline_at is not None
    assert STALLED.provision_deadline_at.isoformat() in decision.details
