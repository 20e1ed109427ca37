"""What became of jobs and their attempts, counted once per event and only once it is true.

Every writer that ends an attempt or a job notes what it did in an :class:`OutcomeTally`
inside its transaction, and the tally reaches :class:`JobOutcomes` only after the commit:
a transaction that rolls back — fenced, raced, failed — counts nothing, and a
compare-and-set that lost noted nothing. The scheduler's writers (a worker's completion, a
lease run out, a time limit, a dispatch taken back, a cancel, the request watchdogs) own
their transactions and hand the tally over after their commit; the ledger's
``REPLACE_MACHINE`` (the reaper's nets, the sweeper's losses) writes inside its caller's
transaction and hands it over through :func:`gpufleet.common.db.when_committed.when_committed`.
What the tally counts is read from the job's state before and after the write, so the rule
is in one place:

- a job that was not final and is now (SUCCEEDED, FAILED, CANCELLED, TIMED_OUT) finished,
  by kind and that state;
- a job sent back to the queue after an attempt ended was retried, by kind and the failure
  class the attempt's ledger row names;
- an attempt ended LOST was lost, whatever became of its job.
"""

from __future__ import annotations

from collections import Counter

from gpufleet.common.db.enums import TERMINAL_JOB_STATES, JobState
from gpufleet.common.metrics.catalog import ATTEMPTS_LOST, JOBS_FINISHED, JOBS_RETRIED
from gpufleet.common.metrics.instruments import Instruments

_FINAL = frozenset(s.value for s in TERMINAL_JOB_STATES)
_QUEUED = JobState.QUEUED.value


class OutcomeTally:
    """One transaction's endings, kept until it commits."""

    def __init__(self) -> None:
        self.finished: Counter[tuple[str, str]] = Counter()  # (kind, final state)
        self.retried: Counter[tuple[str, str]] = Counter()  # (kind, failure class)
        self.lost: Counter[str] = Counter()  # kind

    def job_moved(self, kind: str, before: str, after: str, failure_class: str | None = None) -> None:
        """A job went from state ``before`` to ``after`` in this transaction; ``failure_class``:
        the ledger class of the attempt whose end moved it (None when no attempt failed)."""
        if before in _FINAL or before == after:
            return
        if after in _FINAL:
            self.finished[(kind, after)] += 1
        elif after == _QUEUED and failure_class is not None:
            self.retried[(kind, failure_class)] += 1

    def attempt_lost(self, kind: str) -> None:
        self.lost[kind] += 1

    def __bool__(self) -> bool:
        return bool(self.finished or self.retried or self.lost)


class JobOutcomes:
    """The counters a committed :class:`OutcomeTally` goes to."""

    def __init__(self, instruments: Instruments) -> None:
        self._finished = instruments.counter(JOBS_FINISHED)
        self._retried = instruments.counter(JOBS_RETRIED)
        self._lost = instruments.counter(ATTEMPTS_LOST)

    def committed(self, tally: OutcomeTally) -> None:
        for (kind, state), n in tally.finished.items():
            self._finished.add(n, {"kind": kind, "outcome": state})
        for (kind, failure_class), n in tally.retried.items():
            self._retried.add(n, {"kind": kind, "failure_class": failure_class})
        for kind, n in tally.lost.items():
            self._lost.add(n, {"kind": kind})
