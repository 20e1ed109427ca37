"""``python -m gpufleet.reaper`` with ``GPUFLEET_INCIDENT_WEBHOOK_URL`` set posts an incident
opened by another service (a row in the shared table) to a real HTTP server, and its metrics
listener shows it leading, the incident open and the post sent; stopped and started again,
it posts what opened meanwhile and not what it had already posted. Without the setting it
posts nothing and leaves no webhook row behind."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import WatchdogStat
from gpufleet.common.ledger import open_incident
from gpufleet.common.trust.identity import Role
from gpufleet.reaper.incident_notifier import NAME
from tests.support import scrape, tls
from tests.support.postgres import free_port
from tests.support.procs import ServiceProcess, start_service
from tests.support.webhook_receiver import serve_receiver


def reaper(pg_url: str, tmp_path: Path, env: dict[str, str]) -> ServiceProcess:
    return start_service(
        "reaper",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:1",
            "GPUFLEET_INSTANCE_NAME": "reaper-under-test",
            "GPUFLEET_CLOCK": "real",
            **env,
        },
    )


def incident(sessions: sessionmaker[Session], summary: str) -> int:
    with sessions() as s, s.begin():
        row = open_incident(s, datetime.now(UTC), "paid_wait", summary)
        assert row is not None
        s.flush()
        return row.id


def webhook_runs(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        row = s.get(WatchdogStat, NAME)
        return row.runs if row is not None else -1


def wait_runs(sessions: sessionmaker[Session], more_than: int, proc: ServiceProcess) -> None:
    deadline = time.monotonic() + 20
    while webhook_runs(sessions) <= more_than:
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.05)


def scraped(port: int, proc: ServiceProcess, name: str, value: float, **labels: str) -> None:
    """Until the reaper's /metrics shows ``name{labels} == value`` (Prometheus' view)."""
    context = scrape.client_context(str(tls.files(Role.METRICS).ca), tls.files(Role.METRICS))
    deadline = time.monotonic() + 20
    while True:
        answer = scrape.get(port, context=context, server_name="reaper.gpufleet.local")
        if scrape.sample(answer.body, name, **labels) == value:
            return
        assert time.monotonic() < deadline, f"{name} {labels}: {answer.body}\n{proc.log()}"
        time.sleep(0.1)


def test_the_reaper_process_posts_incidents_and_resumes_after_a_restart(pg_url: str, tmp_path: Path) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    metrics_port = free_port()
    with serve_receiver() as receiver:
        env = {
            "GPUFLEET_INCIDENT_WEBHOOK_URL": receiver.url,
            "GPUFLEET_INCIDENT_WEBHOOK_POLL_S": "0.2",
            "GPUFLEET_STATE_METRICS_EVERY_S": "0.2",
            "GPUFLEET_METRICS_ADDRESS": f"127.0.0.1:{metrics_port}",
        }
        proc = reaper(pg_url, tmp_path, env)
        try:
            wait_runs(sessions, 0, proc)  # leading, and its cursor taken up
            first = incident(sessions, "job a waited 31 min")
            assert receiver.wait_for(1)[0]["alerts"][0]["labels"]["incident_id"] == str(first)
            scraped(metrics_port, proc, "gpufleet_leader_leading", 1, lease="reaper")
            scraped(metrics_port, proc, "gpufleet_incidents_open", 1, failure_class="paid_wait")
            scraped(metrics_port, proc, "gpufleet_incidents_notifications_total", 1, outcome="sent")
            scraped(metrics_port, proc, "gpufleet_watchdog_cadence_seconds", 0.2, net=NAME)
        finally:
            proc.stop(timeout=45)
        assert proc.process.returncode == 0, proc.log()

        second = incident(sessions, "job b waited 31 min")  # while no reaper runs
        proc = reaper(pg_url, tmp_path, env)
        try:
            posted = receiver.wait_for(2)
            runs = webhook_runs(sessions)
            wait_runs(sessions, runs + 2, proc)  # two more looks after it: nothing else came
            assert len(receiver.received) == 2
        finally:
            proc.stop(timeout=45)
    assert [b["alerts"][0]["labels"]["incident_id"] for b in posted] == [str(first), str(second)]


def test_without_the_setting_nothing_is_posted_and_no_webhook_row_is_left(
    pg_url: str, tmp_path: Path
) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    with sessions() as s, s.begin():
        # Left by an earlier run that had the webhook on.
        s.add(WatchdogStat(name=NAME, service="reaper", cadence_s=10, runs=3, actions={}, refusals={}))
    proc = reaper(pg_url, tmp_path, {})
    try:
        deadline = time.monotonic() + 20
        while webhook_runs(sessions) != -1:
            assert time.monotonic() < deadline, proc.log()
            time.sleep(0.05)
    finally:
        proc.stop(timeout=45)
    assert proc.process.returncode == 0, proc.log()
