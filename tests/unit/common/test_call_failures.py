"""What a failed create or start does to its machine's row, written out by hand: the one
decision the scheduler's scale step and the simulator both apply."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.common.call_failures import CallFailure, Op, decide_call_failure
from gpufleet.common.db.enums import MachineIntent, MachineState

S, IN = MachineState, MachineIntent


@pytest.mark.parametrize(
    ("op", "cls", "definitive", "failures_before", "expected"),
    [
        # The provider refused outright: nothing exists or runs, the row leaves its
        # transitional state; a start also backs off, doubling with each failure in a row.
        (
            "create",
            "stockout",
            True,
            0,
            CallFailure(0, None, S.DESTROYED, IN.DESTROYED, "the provider refused the create: stockout"),
        ),
        (
            "start",
            "stockout",
            True,
            0,
            CallFailure(1, 60.0, S.STOPPED, IN.STOPPED, "the provider refused the start: stockout"),
        ),
        (
            "start",
            "quota_exceeded",
            True,
            2,
            CallFailure(3, 240.0, S.STOPPED, IN.STOPPED, "the provider refused the start: quota_exceeded"),
        ),
        # The outcome is unknown (the call failed, its answer was lost): the row stays in its
        # transitional state for the stuck-transition net; a start backs off all the same.
        (
            "create",
            "provider_call_failed",
            False,
            0,
            CallFailure(0, None, None, None, "the create failed: provider_call_failed"),
        ),
        (
            "start",
            "provider_call_failed",
            False,
            0,
            CallFailure(1, 60.0, None, None, "the start failed: provider_call_failed"),
        ),
        (
            "start",
            "provider_call_failed",
            False,
            3,
            CallFailure(4, 480.0, None, None, "the start failed: provider_call_failed"),
        ),
    ],
)
def test_a_failed_call_updates_its_row_so(
    op: Op, cls: str, definitive: bool, failures_before: int, expected: CallFailure
) -> None:
    assert decide_call_failure(op, cls, definitive, failures_before, start_backoff_s=60.0) == expected


def test_the_rows_columns_each_applier_writes() -> None:
    """The columns the scale step and the simulator write from one failure: the pending
    call cleared and the count always; the back-off's end only for a start; the intent only
    where the row leaves its transitional state."""
    now = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    refused_start = decide_call_failure("start", "stockout", True, 2, 60.0)
    assert refused_start.values(now) == {
        "pending_call": None,
        "pending_call_at": None,
        "start_failures": 3,
        "backoff_until": now + timedelta(seconds=240),
        "intent": "STOPPED",
    }
    lost_create = decide_call_failure("create", "provider_call_failed", False, 0, 60.0)
    assert lost_create.values(now) == {"pending_call": None, "pending_call_at": None, "start_failures": 0}
