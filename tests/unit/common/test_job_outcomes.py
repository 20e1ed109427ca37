"""What a transaction did to a job, counted from its state before and after: finished once
it reaches a final state (and never again), retried when an attempt's failure sends it back
to the queue, an attempt lost whatever became of its job; and nothing before the commit
hands the tally over."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.metrics.catalog import ATTEMPTS_LOST, JOBS_FINISHED, JOBS_RETRIED
from tests.support.metrics import MetricsProbe

CASES = [
    # (before, after, failure class) -> finished (kind, outcome) | retried (kind, class) | nothing
    ("RUNNING", "SUCCEEDED", None, "finished", ("short", "SUCCEEDED")),
    ("RUNNING", "FAILED", "job_failed", "finished", ("short", "FAILED")),
    ("DISPATCHING", "CANCELLED", None, "finished", ("short", "CANCELLED")),
    ("QUEUED", "CANCELLED", None, "finished", ("short", "CANCELLED")),
    ("RUNNING", "TIMED_OUT", "job_timed_out", "finished", ("short", "TIMED_OUT")),
    ("RUNNING", "QUEUED", "job_failed", "retried", ("short", "job_failed")),
    ("DISPATCHING", "QUEUED", "job_infra_error", "retried", ("short", "job_infra_error")),
    ("RUNNING", "QUEUED", "lease_expired", "retried", ("short", "lease_expired")),
    # Nothing new: already final (a late writer), or no attempt's failure sent it back.
    ("CANCELLED", "CANCELLED", None, None, None),
    ("SUCCEEDED", "FAILED", "job_failed", None, None),
    ("DISPATCHING", "QUEUED", None, None, None),
    ("RUNNING", "RUNNING", None, None, None),
]


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


@pytest.mark.parametrize(("before", "after", "failure_class", "counter", "key"), CASES)
def test_a_job_moved_is_counted_by_the_rule(
    before: str, after: str, failure_class: str | None, counter: str | None, key: tuple[str, str] | None
) -> None:
    tally = OutcomeTally()
    tally.job_moved("short", before, after, failure_class)
    assert dict(tally.finished) == ({key: 1} if counter == "finished" else {})
    assert dict(tally.retried) == ({key: 1} if counter == "retried" else {})
    assert not tally.lost


def test_the_counters_move_only_when_a_committed_tally_is_handed_over(probe: MetricsProbe) -> None:
    outcomes = JobOutcomes(probe.instruments)
    tally = OutcomeTally()
    tally.job_moved("short", "RUNNING", "SUCCEEDED")
    tally.job_moved("short", "RUNNING", "SUCCEEDED")
    tally.job_moved("film", "RUNNING", "QUEUED", "lease_expired")
    tally.attempt_lost("film")
    assert probe.series(JOBS_FINISHED.name) == {}  # the transaction has not committed yet

    outcomes.committed(tally)
    assert probe.series(JOBS_FINISHED.name) == {(("kind", "short"), ("outcome", "SUCCEEDED")): 2}
    assert probe.series(JOBS_RETRIED.name) == {(("failure_class", "lease_expired"), ("kind", "film")): 1}
    assert probe.series(ATTEMPTS_LOST.name) == {(("kind", "film"),): 1}

    outcomes.committed(OutcomeTally())  # a repeated completion: nothing ended, nothing counted
    assert sum(probe.series(JOBS_FINISHED.name).values()) == 2
