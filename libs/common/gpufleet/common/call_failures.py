"""What a failed create or start does to its machine's row: one pure decision that the
fleet tick's scale step (``gpufleet.scheduler.tick.scale``) and the simulator both apply.

Before this module the simulator kept its own copy of the rule, and the copy had drifted:
it backed a machine's start off only when the provider refused outright, while the
scheduler backs off after *every* failed start — a refusal, an error before the provider,
or an answer that never came — and it wrote no ledger row for a failed call that was not a
refusal. Now both read :func:`decide_call_failure` (issue #26 item 1: a decision returns an
update; each applier writes it).

- The provider refused outright (a stockout, a quota, credentials, a provider the
  provisioner does not serve): nothing was created or started, so the row leaves its
  transitional state — a create ends ``DESTROYED``, a start goes back to ``STOPPED`` — and
  nothing counts as capacity on its way.
- Anything else (the call failed, or its answer was lost): the outcome is unknown, the row
  stays in its transitional state, visible, for the stuck-transition net to settle from
  the provider's own list.
- A failed start, either way, waits out a back-off doubling with each failure in a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from gpufleet.common.db.enums import MachineIntent, MachineState

Op = Literal["create", "start"]


@dataclass(frozen=True)
class CallFailure:
    """The row's update. ``end_state``/``intent`` None: it stays in its transitional state
    with its intent; ``backoff_s`` None: no back-off (a create's record ends or stays)."""

    start_failures: int
    backoff_s: float | None
    end_state: MachineState | None
    intent: MachineIntent | None
    why: str

    def values(self, now: datetime) -> dict[str, Any]:
        """The row's columns the failure writes at ``now`` (the state's move, when it ends,
        is the lifecycle's own write beside them): no call pending any more, the failures
        in a row, the back-off's end and the intent, where they change."""
        out: dict[str, Any] = {
            "pending_call": None,
            "pending_call_at": None,
            "start_failures": self.start_failures,
        }
        if self.backoff_s is not None:
            out["backoff_until"] = now + timedelta(seconds=self.backoff_s)
        if self.end_state is not None and self.intent is not None:
            out["intent"] = self.intent.value
        return out


def decide_call_failure(
    op: Op, failure_class: str, definitive: bool, start_failures: int, start_backoff_s: float
) -> CallFailure:
    """What ``op``'s failure (its ledger class, whether the provider refused outright) does
    to a machine that had failed to start ``start_failures`` times in a row."""
    backoff_s: float | None = None
    if op == "start":
        start_failures += 1
        backoff_s = start_backoff_s * 2 ** (start_failures - 1)
    if not definitive:
        return CallFailure(start_failures, backoff_s, None, None, f"the {op} failed: {failure_class}")
    why = f"the provider refused the {op}: {failure_class}"
    if op == "create":
        return CallFailure(start_failures, backoff_s, MachineState.DESTROYED, MachineIntent.DESTROYED, why)
    return CallFailure(start_failures, backoff_s, MachineState.STOPPED, MachineIntent.STOPPED, why)
