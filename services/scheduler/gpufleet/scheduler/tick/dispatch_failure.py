"""Why a dispatch failed, and whether its machine backs off for it.

A machine's dispatch back-off keeps jobs away from an agent that answered StartJob badly
or did not answer. It must never be applied for a delay or a fault of the control plane's
own: a StartJob still queued in the scheduler's own call pool when the dispatch deadline
passed (the pool was busy — say, behind slow cloud creates), tokens that could not be
written, or an attempt no process here was dispatching (a leader change, a restart). Those
take the attempt back, uncharged, and leave the machine alone: backing a healthy machine
off for our own queueing would shrink the fleet exactly when demand is highest.

Both decisions here are pure: :func:`classify_agent_error` reads the status an agent call
ended with, and :func:`overdue` decides whether a dispatch past its deadline is taken back
and why. Whether the machine backs off is one table, :data:`BACKS_OFF`; for how long,
:func:`backoff_s`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

import grpc

from gpufleet.common import grpcclient
from gpufleet.common.clients.agent import TIMEOUT_S as AGENT_TIMEOUT_S


class DispatchFailure(enum.StrEnum):
    # The agent answered StartJob with an error (it refused the job, or failed to start it).
    AGENT_REFUSED = "agent_refused"
    # The call reached no agent that answered: connection refused or reset, a handshake
    # that failed (another machine's certificate at the address), the agent's own overload.
    AGENT_UNREACHABLE = "agent_unreachable"
    # The agent was sent StartJob and gave no answer within the deadline.
    AGENT_TIMEOUT = "agent_timeout"
    # Ours: no process here was dispatching the attempt when its deadline passed (its
    # leader changed or restarted and the adopting leader came too late).
    NOT_DISPATCHED = "not_dispatched"
    # Ours: the attempt's tokens could not be written before a re-dispatch.
    TOKENS_NOT_MINTED = "tokens_not_minted"


# Whether the machine backs off for the failure: only for an agent that answered badly or
# did not answer.
BACKS_OFF: dict[DispatchFailure, bool] = {
    DispatchFailure.AGENT_REFUSED: True,
    DispatchFailure.AGENT_UNREACHABLE: True,
    DispatchFailure.AGENT_TIMEOUT: True,
    DispatchFailure.NOT_DISPATCHED: False,
    DispatchFailure.TOKENS_NOT_MINTED: False,
}


def backoff_s(failures_in_a_row: int, base_s: float, max_s: float) -> float:
    """How long a machine is kept from jobs after its ``failures_in_a_row``-th dispatch
    failure in a row that backs off: ``base_s``, doubling per failure, capped at ``max_s``.
    One rule for the dispatch's write and for the simulator's."""
    return min(base_s * 2.0 ** (failures_in_a_row - 1), max_s)


@dataclass(frozen=True)
class DispatchBackoff:
    """A machine's dispatch back-off columns after a dispatch's outcome: the failures in a
    row that backed off, and until when no job is placed on it (None: not backing off).
    The dispatch's SQL writes and the simulator apply the same values (issue 26)."""

    dispatch_failures: int
    dispatch_backoff_until: datetime | None

    def values(self) -> dict[str, object]:
        return {
            "dispatch_failures": self.dispatch_failures,
            "dispatch_backoff_until": self.dispatch_backoff_until,
        }


# A dispatch its agent took: the back-off starts over.
DISPATCH_TOOK = DispatchBackoff(0, None)


def backed_off(failures_in_a_row: int, now: datetime, base_s: float, max_s: float) -> DispatchBackoff:
    """The back-off after one more failure that backs off (:data:`BACKS_OFF`), the machine
    having had ``failures_in_a_row`` before it: ``backoff_s`` from ``now``."""
    failures = failures_in_a_row + 1
    return DispatchBackoff(failures, now + timedelta(seconds=backoff_s(failures, base_s, max_s)))


_NO_ANSWER = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.CANCELLED}


def classify_agent_error(code: grpc.StatusCode | None) -> DispatchFailure:
    """The failure an agent call ended with, from its status code (None: not a gRPC status).

    DEADLINE_EXCEEDED is a timeout; codes that mean no agent answered as this machine are
    unreachable; anything else is an answer, and a refusal."""
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DispatchFailure.AGENT_TIMEOUT
    if code in _NO_ANSWER:
        return DispatchFailure.AGENT_UNREACHABLE
    return DispatchFailure.AGENT_REFUSED


def unanswered(timeout_s: float = AGENT_TIMEOUT_S) -> tuple[DispatchFailure, float]:
    """What a StartJobs call to an agent the path does not reach ends with, and after how
    long: no try is answered (each runs to its deadline and ends DEADLINE_EXCEEDED, retried
    as the idempotent call it is: ``grpcclient.unanswered_s``), read as
    :func:`classify_agent_error` reads it. The simulator times such a dispatch by it."""
    failure = classify_agent_error(grpc.StatusCode.DEADLINE_EXCEEDED)
    return failure, grpcclient.unanswered_s(timeout_s, idempotent=True)


def overdue(
    now: datetime, *, deadline: timedelta, in_flight: bool, sent_at: datetime | None
) -> DispatchFailure | None:
    """Whether a dispatch still STARTING past its deadline (counted from its commit) is
    taken back now, and why (None: not now).

    - dispatched here and sent to its agent longer than ``deadline`` ago: the agent did not
      answer in time (``AGENT_TIMEOUT``, backs off);
    - dispatched here but sent less than ``deadline`` ago, or still waiting in this
      process's own call pool: not taken back — the wait is ours, and the call's own
      gRPC deadline bounds it once sent;
    - dispatched by no process here (``NOT_DISPATCHED``): taken back, no back-off.
    """
    if not in_flight:
        return DispatchFailure.NOT_DISPATCHED
    if sent_at is not None and now - sent_at > deadline:
        return DispatchFailure.AGENT_TIMEOUT
    return None
