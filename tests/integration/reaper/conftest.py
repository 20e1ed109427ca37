"""A reaper wired as ``main.build`` wires it — real store, real gRPC clients, real Ticker
and leader lease — but on a manual clock the test advances, against a provisioner served
on 127.0.0.1 port 0 (scripted, or the real service with its sim driver)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Machine, WatchdogStat
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import Ticker
from gpufleet.reaper.agent_probe import GrpcAgentProber
from gpufleet.reaper.idle_scanner import GrpcAgentSampler
from gpufleet.reaper.main import build_watchdogs
from gpufleet.reaper.settings import Settings
from tests.support import tls
from tests.support.scripted_services import serve_provisioner


@dataclass
class Chain:
    clock: ManualClock
    sessions: sessionmaker[Session]
    lease: LeaderLease
    ticker: Ticker
    # A ScriptedProvisioner, or a SimProvisioner (the real service with its sim driver).
    provisioner: Any
    # The nets' stops and destroys run here, after their pass has returned.
    calls: CallPool
    # True: every running machine's worker reports before each tick (healthy workers),
    # so a test of the money chain is not also a test of the report-reading nets.
    heartbeats: bool = False

    def tick(self, *, settle: bool = True) -> None:
        """One pass of the loop: renew the lease, run every watchdog that is due — and, unless
        told not to, wait for the stops and destroys it sent to answer and be recorded."""
        if self.heartbeats:
            with self.sessions() as s, s.begin():
                s.execute(
                    update(Machine)
                    .where(Machine.state.in_(["BOOTING", "READY", "DRAINING"]))
                    .values(worker_report_at=self.clock.now())
                )
        self.lease.try_acquire()
        self.ticker.run_due()
        if settle:
            self.settle()

    def step(self, seconds: float = 30.0, *, settle: bool = True) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.tick(settle=settle)

    def settle(self, timeout_s: float = 30.0) -> None:
        assert self.calls.wait_idle(timeout_s), f"{self.calls.pending()} provider calls still in flight"

    def stats(self, name: str) -> WatchdogStat:
        with self.sessions() as s:
            row = s.get(WatchdogStat, name)
            assert row is not None
            return row


@contextmanager
def wire_reaper(
    db_url: str,
    clock: ManualClock,
    provisioner_address: str,
    provisioner: Any,
    *,
    provider_timeout_s: float = 5.0,
    **overrides: Any,
) -> Iterator[Chain]:
    """``overrides`` are the reaper's settings a test changes."""
    settings = Settings(database_url=db_url, instance_name="test-reaper", agent_timeout_s=2.0, **overrides)
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    client = ProvisionerClient(provisioner_address, tls.transport("reaper"), timeout_s=provider_timeout_s)
    lease = LeaderLease("reaper", settings.instance_name, clock, sessions, ttl_s=settings.lease_ttl_s)
    sampler = GrpcAgentSampler(
        tls.transport("reaper"), window=timedelta(0), timeout_s=settings.agent_timeout_s
    )
    prober = GrpcAgentProber(tls.transport("reaper"), timeout_s=settings.agent_timeout_s)
    calls = CallPool(settings.provider_call_workers, "provider-calls")
    tasks = build_watchdogs(settings, sessions, lease, clock, client, sampler, prober, calls=calls)
    ticker = Ticker("reaper", clock, sessions, lease, tasks, renew_s=settings.lease_renew_s)
    try:
        yield Chain(
            clock=clock, sessions=sessions, lease=lease, ticker=ticker, provisioner=provisioner, calls=calls
        )
    finally:
        calls.close()
        client.close()
        engine.dispose()


@pytest.fixture
def chain(db_url: str) -> Iterator[Chain]:
    """The reaper against a scripted provisioner (call-by-call assertions, scripted failures)."""
    clock = ManualClock()
    with (
        serve_provisioner() as provisioner,
        wire_reaper(db_url, clock, provisioner.address, provisioner) as c,
    ):
        yield c
