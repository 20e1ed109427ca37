"""The lease's margin, stated: the machine's fence falls at half of the lease the
scheduler granted, the stop gets at most a quarter of the rest, and a lease that cannot
hold the first lease's hand-off is named a violation (the scheduler's settings refuse it:
tests/unit/scheduler/test_lease_settings.py)."""

from __future__ import annotations

import pytest

from gpufleet.common.lease_fence import (
    fenced_grace_cap_s,
    lease_violation,
    margin_s,
    runner_fence_s,
)


@pytest.mark.parametrize(
    ("granted_s", "fence_s", "margin", "grace_cap_s"),
    [
        (90.0, 45.0, 45.0, 11.25),  # the scheduler's default
        (900.0, 450.0, 450.0, 112.5),  # the demo's (at 120x: 3.75 s of real time to the fence)
        (10.0, 5.0, 5.0, 1.25),
    ],
)
def test_the_runner_stops_at_half_the_granted_lease(
    granted_s: float, fence_s: float, margin: float, grace_cap_s: float
) -> None:
    assert runner_fence_s(granted_s) == fence_s
    assert margin_s(granted_s) == margin
    assert fenced_grace_cap_s(granted_s) == grace_cap_s
    # The stated margin: the control plane's lease outlasts the fence plus the longest
    # stop by more than a third of the lease, left for the first lease's hand-off.
    assert granted_s - (runner_fence_s(granted_s) + fenced_grace_cap_s(granted_s)) == granted_s * 3 / 8


def test_no_fence_from_a_lease_never_granted() -> None:
    with pytest.raises(ValueError, match="positive"):
        runner_fence_s(0.0)


@pytest.mark.parametrize(
    ("lease_s", "dispatch_deadline_s", "refused"),
    [
        (90.0, 30.0, False),  # the defaults: 33.75 s of room for a 30 s hand-off
        (900.0, 30.0, False),  # the demo's
        (80.0, 30.0, True),  # exactly no room left
        (60.0, 30.0, True),
        (60.0, 20.0, False),
    ],
)
def test_a_lease_that_cannot_hold_the_hand_off_is_a_violation(
    lease_s: float, dispatch_deadline_s: float, refused: bool
) -> None:
    assert (lease_violation(lease_s, dispatch_deadline_s) is not None) is refused
