"""The incident webhook against a real HTTP server on 127.0.0.1 and a real PostgreSQL: what
it posts for an incident opened and resolved (Alertmanager's shape, Slack's), that a post
is retried until it lands and counted once, that a receiver that is down is counted failed
while the nets run on, that only the leader posts, and that a restart neither posts again
what was posted nor skips what changed while no reaper ran.

The notifier is driven a poll at a time on a manual clock (its sender thread is real); each
post's outcome is read from its own instruments and from its row in ``watchdog_stats``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from sqlalchemy import update
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import IncidentState
from gpufleet.common.db.models import Incident, WatchdogStat
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import open_incident
from gpufleet.common.metrics.catalog import INCIDENT_NOTIFICATIONS
from gpufleet.reaper.incident_notifier import NAME, IncidentNotifier, NotifierPolicy
from gpufleet.reaper.incident_webhook import WebhookFormat, WebhookPolicy, WebhookSender
from tests.integration.reaper.conftest import Chain
from tests.support.metrics import MetricsProbe
from tests.support.webhook_receiver import Receiver, nowhere_url, serve_receiver

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
NOTIFIED = INCIDENT_NOTIFICATIONS.name


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve_receiver() as r:
        yield r


def leader(sessions: sessionmaker[Session], clock: ManualClock, holder: str = "reaper-a") -> LeaderLease:
    lease = LeaderLease("reaper", holder, clock, sessions, ttl_s=3600)
    assert lease.try_acquire()
    return lease


def notifier(
    sessions: sessionmaker[Session],
    clock: ManualClock,
    lease: LeaderLease,
    url: str,
    probe: MetricsProbe,
    *,
    fmt: WebhookFormat = WebhookFormat.ALERTMANAGER,
    attempts: int = 3,
    backoff_s: float = 0.01,
    outbox_size: int = 100,
) -> IncidentNotifier:
    sender = WebhookSender(WebhookPolicy(url, fmt, timeout_s=5.0, attempts=attempts, backoff_s=backoff_s))
    policy = NotifierPolicy(poll_s=10.0, lookback_s=600.0, outbox_size=outbox_size)
    n = IncidentNotifier(sessions, clock, lease, sender, policy, instruments=probe.instruments)
    n.start_sending()
    return n


def opened(sessions: sessionmaker[Session], at: datetime, failure_class: str, summary: str) -> int:
    with sessions() as s, s.begin():
        incident = open_incident(s, at, failure_class, summary, job_id="job-1")
        assert incident is not None
        s.flush()
        return incident.id


def resolved(sessions: sessionmaker[Session], incident_id: int, at: datetime) -> None:
    """As the scheduler's paid-wait watchdog resolves one."""
    with sessions() as s, s.begin():
        s.execute(
            update(Incident)
            .where(Incident.id == incident_id)
            .values(state=IncidentState.RESOLVED.value, resolved_at=at)
        )


def settled(n: IncidentNotifier) -> None:
    assert n.wait_idle(30), "the sender did not settle"


def cursor_row(sessions: sessionmaker[Session]) -> WatchdogStat:
    with sessions() as s:
        row = s.get(WatchdogStat, NAME)
        assert row is not None
        return row


def alert(body: dict[str, Any]) -> dict[str, Any]:
    assert body["version"] == "4"
    assert len(body["alerts"]) == 1
    a: dict[str, Any] = body["alerts"][0]
    assert a["status"] == body["status"]
    return a


def test_an_incident_opened_then_resolved_is_posted_firing_then_resolved_in_alertmanagers_shape(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    n = notifier(sessions, clock, leader(sessions, clock), receiver.url, probe)
    try:
        assert n.poll() == 0  # the first look starts the cursor: nothing before it is posted
        clock.advance(5)
        incident = opened(sessions, clock.now(), "paid_wait", "job job-1 waited 31 min on a paid machine")
        clock.advance(5)
        assert n.poll() == 1
        settled(n)
        clock.advance(60)
        resolved(sessions, incident, clock.now())
        clock.advance(5)
        assert n.poll() == 1
        settled(n)
    finally:
        n.close()

    firing, ended = receiver.received
    assert firing["status"] == "firing" and ended["status"] == "resolved"
    labels = {"alertname": "GpufleetIncident", "failure_class": "paid_wait", "incident_id": str(incident)}
    a, b = alert(firing), alert(ended)
    assert a["labels"] == labels and b["labels"] == labels
    assert a["fingerprint"] == b["fingerprint"]  # a receiver pairs the resolve with its firing
    assert a["annotations"]["summary"] == "paid_wait: job job-1 waited 31 min on a paid machine"
    assert a["annotations"]["job_id"] == "job-1"
    assert a["startsAt"] == b["startsAt"] == "2026-12-03T09:00:05Z"
    assert a["endsAt"] == "0001-01-01T00:00:00Z"
    assert b["endsAt"] == "2026-12-03T09:01:10Z"
    assert firing["groupLabels"] == {"alertname": "GpufleetIncident"}
    assert probe.series(NOTIFIED) == {(("outcome", "sent"),): 2}
    row = cursor_row(sessions)
    assert row.last_run_at == clock.now() and row.actions == {"sent": 2}
    probe.close()


def test_the_slack_shape_is_one_line_of_text(sessions: sessionmaker[Session], receiver: Receiver) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    what = "sim-l4 out of capacity in sim-1"
    n = notifier(sessions, clock, leader(sessions, clock), receiver.url, probe, fmt=WebhookFormat.SLACK)
    try:
        n.poll()
        clock.advance(5)
        incident = opened(sessions, clock.now(), "stockout", what)
        resolved(sessions, incident, clock.advance(5))
        clock.advance(5)
        assert n.poll() == 2  # opened and resolved within one look: both, in that order
        settled(n)
    finally:
        n.close()
    assert receiver.received == [
        {"text": f":rotating_light: gpufleet incident {incident} opened: stockout: {what}"},
        {"text": f":white_check_mark: gpufleet incident {incident} resolved: stockout: {what}"},
    ]
    probe.close()


def test_a_receiver_that_fails_twice_gets_the_post_once_on_the_third_try(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    receiver.fail_next = 2
    n = notifier(sessions, clock, leader(sessions, clock), receiver.url, probe, attempts=3)
    try:
        n.poll()
        opened(sessions, clock.advance(5), "transition_stuck", "machine m-1 STOPPING for 40 min")
        clock.advance(5)
        n.poll()
        settled(n)
    finally:
        n.close()
    assert receiver.requests == 3
    assert len(receiver.received) == 1
    assert probe.series(NOTIFIED) == {(("outcome", "sent"),): 1}
    probe.close()


def test_a_receiver_that_is_down_is_counted_failed_and_the_cursor_moves_on(
    sessions: sessionmaker[Session],
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    n = notifier(sessions, clock, leader(sessions, clock), nowhere_url(), probe, attempts=2)
    try:
        n.poll()
        opened(sessions, clock.advance(5), "auth_failed", "gcp refused our credentials")
        clock.advance(5)
        n.poll()
        settled(n)
    finally:
        n.close()
    assert probe.series(NOTIFIED) == {(("outcome", "failed"),): 1}
    row = cursor_row(sessions)
    # Given up after its tries: not posted again by this reaper or the next.
    assert row.last_run_at == clock.now() and row.actions == {"failed": 1}
    probe.close()


def test_the_nets_run_while_a_post_hangs_and_while_the_receiver_is_down(
    chain: Chain, receiver: Receiver
) -> None:
    """The reaper's own nets (its Ticker, on the same store and lease) tick while the
    notifier's post waits on a receiver that does not answer, then on one that is gone."""
    probe = MetricsProbe()
    chain.tick()
    runs = chain.stats("idle_scanner").runs
    receiver.let_through.clear()
    n = notifier(chain.sessions, chain.clock, chain.lease, receiver.url, probe)
    try:
        n.poll()
        opened(chain.sessions, chain.clock.now(), "paid_wait", "job job-1 waited 31 min")
        chain.clock.advance(1)
        n.poll()
        assert receiver.arrived.wait(10)  # the post is out, and held
        for _ in range(3):
            chain.step(30)
        assert chain.stats("idle_scanner").runs == runs + 3
        receiver.let_through.set()
        settled(n)
    finally:
        n.close()
    assert probe.series(NOTIFIED) == {(("outcome", "sent"),): 1}
    probe.close()


def test_only_the_leader_posts(sessions: sessionmaker[Session], receiver: Receiver) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    leading = leader(sessions, clock, "reaper-a")
    standby_lease = LeaderLease("reaper", "reaper-b", clock, sessions, ttl_s=3600)
    assert not standby_lease.try_acquire()
    standby = notifier(sessions, clock, standby_lease, receiver.url, probe)
    try:
        opened(sessions, clock.advance(5), "paid_wait", "job job-1 waited 31 min")
        clock.advance(5)
        assert standby.poll() == 0
        settled(standby)
    finally:
        standby.close()
    assert receiver.requests == 0
    assert leading.is_leader
    probe.close()


def test_a_restart_posts_neither_again_nor_skips_what_changed_meanwhile(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    lease = leader(sessions, clock)
    first = notifier(sessions, clock, lease, receiver.url, probe)
    try:
        first.poll()
        one = opened(sessions, clock.advance(5), "paid_wait", "job job-1 waited 31 min")
        clock.advance(5)
        first.poll()
        settled(first)
    finally:
        first.close()
    # While no notifier runs: a second incident opens, the first is resolved.
    two = opened(sessions, clock.advance(30), "stockout", "sim-l4 out of capacity")
    resolved(sessions, one, clock.advance(30))

    clock.advance(30)
    second = notifier(sessions, clock, lease, receiver.url, probe)
    try:
        assert second.poll() == 2
        settled(second)
        clock.advance(10)
        assert second.poll() == 0
        settled(second)
    finally:
        second.close()
    posted = [(alert(b)["labels"]["incident_id"], b["status"]) for b in receiver.received]
    assert posted == [(str(one), "firing"), (str(two), "firing"), (str(one), "resolved")]
    assert probe.series(NOTIFIED) == {(("outcome", "sent"),): 3}
    probe.close()


def test_a_post_cut_off_by_a_stop_is_posted_by_the_next_reaper(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    lease = leader(sessions, clock)
    # Down, with a long back-off: the stop comes while the post waits to be tried again.
    first = notifier(sessions, clock, lease, nowhere_url(), probe, attempts=5, backoff_s=60.0)
    first.poll()
    settled(first)
    incident = opened(sessions, clock.advance(5), "paid_wait", "job job-1 waited 31 min")
    clock.advance(5)
    first.poll()
    first.close()
    assert probe.series(NOTIFIED) == {}  # neither sent nor failed: it was not settled
    assert cursor_row(sessions).last_run_at == T0  # the cursor stayed before it

    clock.advance(10)
    second = notifier(sessions, clock, lease, receiver.url, probe)
    try:
        assert second.poll() == 1
        settled(second)
    finally:
        second.close()
    assert [alert(b)["labels"]["incident_id"] for b in receiver.received] == [str(incident)]
    probe.close()


def test_a_row_committed_after_its_own_timestamp_is_still_posted_once(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    n = notifier(sessions, clock, leader(sessions, clock), receiver.url, probe)
    try:
        n.poll()
        clock.advance(60)
        n.poll()  # the cursor is at T0+60 s
        # A writer whose pass began at T0+30 s commits only now.
        late = opened(sessions, T0 + timedelta(seconds=30), "paid_wait", "job job-1 waited 31 min")
        clock.advance(10)
        assert n.poll() == 1
        clock.advance(10)
        assert n.poll() == 0
        settled(n)
    finally:
        n.close()
    assert [alert(b)["labels"]["incident_id"] for b in receiver.received] == [str(late)]
    probe.close()


def test_a_full_outbox_drops_and_counts_what_it_cannot_hold(
    sessions: sessionmaker[Session], receiver: Receiver
) -> None:
    clock, probe = ManualClock(T0), MetricsProbe()
    receiver.let_through.clear()
    n = notifier(sessions, clock, leader(sessions, clock), receiver.url, probe, outbox_size=1)
    try:
        n.poll()
        opened(sessions, clock.advance(1), "paid_wait", "job job-1 waited 31 min")
        clock.advance(1)
        n.poll()
        assert receiver.arrived.wait(10)  # the sender holds the first; the outbox is empty
        for i in range(2):
            opened(sessions, clock.advance(1), "stockout", f"offering {i} out of capacity")
        clock.advance(1)
        assert n.poll() == 2  # one waits in the outbox, one is dropped
        receiver.let_through.set()
        settled(n)
    finally:
        n.close()
    assert len(receiver.received) == 2
    assert probe.series(NOTIFIED) == {(("outcome", "sent"),): 2, (("outcome", "dropped"),): 1}
    assert cursor_row(sessions).actions == {"sent": 2, "dropped": 1}
    probe.close()


def test_a_database_outage_is_one_line_a_poll_not_a_stack_trace(
    sessions: sessionmaker[Session], receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL restarting is a known condition (gpufleet.common.db.outage): each poll
    says so in one line and tries again; nothing is posted, nothing crashes."""
    clock = ManualClock(T0)
    lease = leader(sessions, clock)

    def down() -> Session:
        raise DisconnectionError("server closed the connection unexpectedly")

    sender = WebhookSender(WebhookPolicy(receiver.url, WebhookFormat.ALERTMANAGER, timeout_s=5.0))
    # Whatever opens a session fails as a restarting server makes it fail.
    unavailable = cast("sessionmaker[Session]", down)
    n = IncidentNotifier(unavailable, clock, lease, sender, NotifierPolicy(poll_s=10.0))
    caplog.set_level(logging.WARNING, logger="gpufleet.reaper.incident_notifier")
    n.start()
    try:
        for _ in range(3):
            deadline = time.monotonic() + 10
            seen = len(caplog.records)
            while len(caplog.records) == seen and time.monotonic() < deadline:
                time.sleep(0.02)
            clock.advance(timedelta(seconds=10))
    finally:
        n.close(5)
    lines = [r for r in caplog.records if "incident webhook" in r.getMessage()]
    assert len(lines) >= 3, [r.getMessage() for r in caplog.records]
    assert all("database is unavailable (server closed the connection" in r.getMessage() for r in lines)
    assert all(r.exc_info is None for r in lines)  # no stack trace
    assert (receiver.requests, receiver.received) == (0, [])
