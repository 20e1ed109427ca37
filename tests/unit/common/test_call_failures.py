"""What a failed create or start does to its machine's row, written out by hand: the one
decision the scheduler's scale step and the simulator both apply."""

from __future__ import annotations

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
