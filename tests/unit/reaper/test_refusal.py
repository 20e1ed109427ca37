"""The refusal ladder, from a table: each gate refuses on its own, in the seed's order."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.reaper.refusal import LADDER, MachineSnapshot, NetGates, RefusalReason, first_refusal

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(minutes=10)

# A machine every gate lets through.
CLEAR = MachineSnapshot(
    machine_id="m",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
    workload_class="REPORTING",
    live_attempts=0,
    first_observed_at=NOW - timedelta(hours=1),
)
MONEY_CHAIN = NetGates(net="auto_stop", grace=GRACE, reads_reports=False)
REPORT_NET = NetGates(net="went_silent", grace=GRACE, reads_reports=True)

CASES = [
    # (id, machine, gates, expected)
    ("act", CLEAR, MONEY_CHAIN, None),
    ("act on report net", CLEAR, REPORT_NET, None),
    ("registered box", replace(CLEAR, origin="REGISTERED"), MONEY_CHAIN, RefusalReason.NOT_OURS),
    ("unknown origin", replace(CLEAR, origin="ADOPTED"), MONEY_CHAIN, RefusalReason.NOT_OURS),
    ("not managed", replace(CLEAR, managed=False), MONEY_CHAIN, RefusalReason.NOT_OURS),
    ("destroyed", replace(CLEAR, state="DESTROYED"), MONEY_CHAIN, RefusalReason.ALREADY_DESTROYED),
    ("running attempt", replace(CLEAR, live_attempts=1), MONEY_CHAIN, RefusalReason.WORK_PINNED),
    (
        "exempt class on report net",
        replace(CLEAR, workload_class="SILENT"),
        REPORT_NET,
        RefusalReason.EXEMPT_CLASS,
    ),
    (
        "unknown class is exempt",
        replace(CLEAR, workload_class="BATCH"),
        REPORT_NET,
        RefusalReason.EXEMPT_CLASS,
    ),
    ("exempt class ignored by money chain", replace(CLEAR, workload_class="SILENT"), MONEY_CHAIN, None),
    (
        "inside grace",
        replace(CLEAR, first_observed_at=NOW - GRACE + timedelta(seconds=1)),
        MONEY_CHAIN,
        RefusalReason.IN_GRACE_WINDOW,
    ),
    ("grace just over", replace(CLEAR, first_observed_at=NOW - GRACE), MONEY_CHAIN, None),
    ("never observed", replace(CLEAR, first_observed_at=None), MONEY_CHAIN, RefusalReason.IN_GRACE_WINDOW),
    ("no grace configured", replace(CLEAR, first_observed_at=None), NetGates(net="x"), None),
    # Order: the earliest gate wins when several would refuse.
    (
        "not ours before destroyed",
        replace(CLEAR, origin="REGISTERED", state="DESTROYED"),
        MONEY_CHAIN,
        RefusalReason.NOT_OURS,
    ),
    (
        "destroyed before pinned",
        replace(CLEAR, state="DESTROYED", live_attempts=2),
        MONEY_CHAIN,
        RefusalReason.ALREADY_DESTROYED,
    ),
    (
        "pinned before exempt",
        replace(CLEAR, live_attempts=1, workload_class="SILENT"),
        REPORT_NET,
        RefusalReason.WORK_PINNED,
    ),
    (
        "exempt before grace",
        replace(CLEAR, workload_class="SILENT", first_observed_at=NOW),
        REPORT_NET,
        RefusalReason.EXEMPT_CLASS,
    ),
    (
        "pinned before grace",
        replace(CLEAR, live_attempts=1, first_observed_at=NOW),
        MONEY_CHAIN,
        RefusalReason.WORK_PINNED,
    ),
]


@pytest.mark.parametrize(("machine", "gates", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_ladder(machine: MachineSnapshot, gates: NetGates, expected: RefusalReason | None) -> None:
    assert first_refusal(NOW, machine, gates) == expected


def test_ladder_order_is_the_seeds() -> None:
    assert [r.value for r in LADDER] == [
        "NOT_OURS",
        "ALREADY_DESTROYED",
        "WORK_PINNED",
        "EXEMPT_CLASS",
        "IN_GRACE_WINDOW",
    ]
