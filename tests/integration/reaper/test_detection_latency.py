"""Each net's detection latency and the idle chain's timers, as an operator reads them.

Real parts: PostgreSQL, the real nets (each built as ``build_watchdogs`` builds it, with
the test's instruments), the real ProvisionerService with its sim driver over gRPC, and
scripted agents over gRPC for the idle scanner's samples; time is a manual clock the test
steps. Each net acts at a known distance from its failure's first sign, and the histogram
holds exactly that many seconds, labelled with the net — and nothing for an act the row
refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.metrics.catalog import REAPER_ACTIONS, REAPER_DETECTION_LATENCY, REAPER_IDLE_TIMERS
from gpufleet.reaper.agent_probe import GrpcAgentProber
from gpufleet.reaper.auto_destroy import AutoDestroy, AutoDestroyPolicy
from gpufleet.reaper.auto_stop import AutoStop, AutoStopPolicy
from gpufleet.reaper.boot_failure import BootFailure, BootFailurePolicy
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.idle_scanner import GrpcAgentSampler, IdlePolicy, IdleScanner
from gpufleet.reaper.lost_detector import LostDetector, LostPolicy
from gpufleet.reaper.provision_deadline import ProvisionDeadline, ProvisionDeadlinePolicy
from gpufleet.reaper.stuck_transition import StuckPolicy, StuckTransition
from gpufleet.reaper.went_silent import WentSilent, WentSilentPolicy
from tests.support import tls
from tests.support.fleet_rows import add_machine, machine
from tests.support.metrics import MetricsProbe
from tests.support.scripted_services import serve_agent
from tests.support.sim_provisioner import SimProvisioner, serve_sim_provisioner

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@dataclass
class Rig:
    clock: ManualClock
    sessions: sessionmaker[Session]
    lease: LeaderLease
    sim: SimProvisioner
    client: ProvisionerClient
    calls: CallPool
    probe: MetricsProbe

    def at(self, seconds: float) -> datetime:
        """Move the clock to T0 + ``seconds``, renewing the reaper's lease as the Ticker does."""
        target = T0 + timedelta(seconds=seconds)
        self.clock.advance(target - self.clock.now())
        assert self.lease.try_acquire()
        return target

    def machine(self, **values: Any) -> str:
        """A READY machine of ours (first seen an hour before T0) with a running sim instance."""
        mid = add_machine(self.sessions, T0, **values)
        instance = self.sim.create(mid)
        with self.sessions() as s, s.begin():
            s.execute(
                update(Machine)
                .where(Machine.id == mid)
                .values(provider_instance_id=instance.provider_instance_id)
            )
        return mid

    def settle(self) -> None:
        assert self.calls.wait_idle(30), f"{self.calls.pending()} provider calls still in flight"

    def latencies(self) -> dict[str, tuple[int, float]]:
        """Each net's detection-latency histogram: (observations, their sum in seconds)."""
        return {
            dict(labels)["net"]: (point.count, point.sum)
            for labels, point in self.probe.points(REAPER_DETECTION_LATENCY.name).items()
        }


@pytest.fixture
def rig(pg_url: str) -> Iterator[Rig]:
    clock = ManualClock(T0)
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    lease = LeaderLease("reaper", "reaper-under-test", clock, sessions, ttl_s=30.0)
    assert lease.try_acquire()
    probe = MetricsProbe()
    calls = CallPool(4, "provider-calls")
    with serve_sim_provisioner(clock) as sim:
        client = ProvisionerClient(sim.address, tls.transport("reaper"), timeout_s=5.0)
        try:
            yield Rig(clock, sessions, lease, sim, client, calls, probe)
        finally:
            calls.close()
            client.close()
            probe.close()
            engine.dispose()


def test_a_machine_silent_since_t_destroyed_at_t_plus_300s_is_one_300s_observation(rig: Rig) -> None:
    mid = rig.machine(worker_report_at=T0)
    net = WentSilent(
        rig.sessions,
        rig.lease,
        rig.clock,
        rig.client,
        WentSilentPolicy(silent_after=timedelta(minutes=5)),
        calls=rig.calls,
        instruments=rig.probe.instruments,
    )
    net.run(rig.at(299))
    assert rig.latencies() == {}  # not silent long enough: no act, nothing measured

    net.run(rig.at(300))
    assert rig.latencies() == {"went_silent": (1, 300.0)}
    rig.settle()
    assert machine(rig.sessions, mid).state == "DESTROYED"
    assert rig.probe.value(REAPER_ACTIONS.name, net="went_silent", action="destroy") == 1
    # The histogram's buckets are the catalogue's, in seconds: 300 s falls in (120, 300].
    [point] = rig.probe.points(REAPER_DETECTION_LATENCY.name).values()
    assert list(point.explicit_bounds) == list(REAPER_DETECTION_LATENCY.buckets)
    assert point.bucket_counts[list(point.explicit_bounds).index(300.0)] == 1


def test_an_act_the_row_refused_is_not_measured(rig: Rig) -> None:
    """The scan saw a silent machine; its worker reported before the claim: no destroy,
    and no latency for an act that did not happen."""
    mid = rig.machine(worker_report_at=T0)
    net = WentSilent(
        rig.sessions,
        rig.lease,
        rig.clock,
        rig.client,
        WentSilentPolicy(silent_after=timedelta(minutes=5)),
        calls=rig.calls,
        instruments=rig.probe.instruments,
    )
    now = rig.at(600)
    scanned = net.scan(now)
    with rig.sessions() as s, s.begin():
        s.execute(update(Machine).where(Machine.id == mid).values(worker_report_at=now))
    decisions = DecisionLog("went_silent", instruments=rig.probe.instruments)
    net.act(now, scanned, decisions)
    assert decisions.report.refusals == {"CHANGED_SINCE_SCAN": 1}
    assert rig.latencies() == {}
    assert machine(rig.sessions, mid).state == "READY"


def test_provision_deadline_counts_from_the_request(rig: Rig) -> None:
    rig.machine(
        state="PROVISIONING",
        requested_at=T0,
        provision_deadline_at=T0 + timedelta(minutes=20),
        first_observed_at=None,
    )
    net = ProvisionDeadline(
        rig.sessions,
        rig.lease,
        rig.clock,
        rig.client,
        ProvisionDeadlinePolicy(),
        calls=rig.calls,
        instruments=rig.probe.instruments,
    )
    net.run(rig.at(20 * 60 - 1))
    assert rig.latencies() == {}
    net.run(rig.at(20 * 60 + 30))  # a pass 30 s after the deadline
    rig.settle()
    assert rig.latencies() == {"provision_deadline": (1, 1230.0)}


def test_boot_failure_counts_from_this_lifes_first_observation(rig: Rig) -> None:
    # Seen running at T0; its agent never answers and its worker never reports.
    rig.machine(state="BOOTING", first_observed_at=T0, state_changed_at=T0, agent_address=None)
    net = BootFailure(
        rig.sessions,
        rig.lease,
        rig.clock,
        rig.client,
        GrpcAgentProber(tls.transport("reaper"), timeout_s=2.0),
        BootFailurePolicy(window=timedelta(minutes=30)),
        calls=rig.calls,
        instruments=rig.probe.instruments,
    )
    net.run(rig.at(30 * 60))  # the first sighting: recorded, not yet acted on
    assert rig.latencies() == {}
    net.run(rig.at(31 * 60))  # re-confirmed: destroyed
    rig.settle()
    assert rig.latencies() == {"boot_failure": (1, 1860.0)}


def test_lost_detector_counts_from_the_first_failed_probe(rig: Rig) -> None:
    mid = rig.machine(
        probe_ok_at=T0 - timedelta(minutes=10),
        probe_failed_since=T0,
        provider_seen_at=T0 + timedelta(seconds=170),
        worker_report_at=T0 - timedelta(minutes=10),
    )
    net = LostDetector(
        rig.sessions,
        rig.lease,
        rig.clock,
        LostPolicy(lost_after=timedelta(minutes=3)),
        instruments=rig.probe.instruments,
    )
    net.run(rig.at(180))
    assert machine(rig.sessions, mid).lost is True
    assert rig.latencies() == {"lost_detector": (1, 180.0)}
    net.run(rig.at(240))  # already marked: no second act
    assert rig.latencies() == {"lost_detector": (1, 180.0)}


def test_the_idle_chain_counts_its_timers_and_measures_its_stop_and_destroy_from_idle_since(
    rig: Rig,
) -> None:
    """Two machines go quiet at T0 (armed); one gets traffic (cleared); the other is
    stopped at T0 + 330 s and destroyed at T0 + 2 h 30 s, both measured from T0."""
    idle = IdlePolicy(stop_after=timedelta(minutes=5), destroy_after=timedelta(hours=2))
    with serve_agent() as quiet_agent, serve_agent() as later_busy:
        quiet_agent.quiet()
        later_busy.quiet()
        quiet = rig.machine(agent_address=quiet_agent.address)
        busy = rig.machine(agent_address=later_busy.address)
        scanner = IdleScanner(
            rig.sessions,
            rig.lease,
            GrpcAgentSampler(tls.transport("reaper"), window=timedelta(0), timeout_s=5.0),
            idle,
            concurrency=2,
            instruments=rig.probe.instruments,
        )
        stop = AutoStop(
            rig.sessions,
            rig.lease,
            rig.clock,
            rig.client,
            AutoStopPolicy(stop_after=idle.stop_after),
            calls=rig.calls,
            instruments=rig.probe.instruments,
        )
        destroy = AutoDestroy(
            rig.sessions,
            rig.lease,
            rig.clock,
            rig.client,
            AutoDestroyPolicy(destroy_after=idle.destroy_after),
            calls=rig.calls,
            instruments=rig.probe.instruments,
        )
        try:
            scanner.run(rig.at(0))
            assert rig.probe.series(REAPER_IDLE_TIMERS.name) == {(("action", "armed"),): 2}

            later_busy.busy(requests=3)
            scanner.run(rig.at(30))  # traffic clears the busy one's; the quiet one stays armed
            assert rig.probe.series(REAPER_IDLE_TIMERS.name) == {
                (("action", "armed"),): 2,
                (("action", "cleared"),): 1,
            }
            assert machine(rig.sessions, busy).stop_due_at is None

            stop.run(rig.at(330))
            rig.settle()
            assert machine(rig.sessions, quiet).state == "STOPPED"
            assert rig.latencies() == {"auto_stop": (1, 330.0)}

            destroy.run(rig.at(2 * 3600 + 30))
            rig.settle()
            assert machine(rig.sessions, quiet).state == "DESTROYED"
            assert rig.latencies() == {"auto_stop": (1, 330.0), "auto_destroy": (1, 7230.0)}
        finally:
            scanner.close()


def test_stuck_transition_counts_from_the_transitions_start(rig: Rig) -> None:
    """A stop whose answer was lost: STOPPING since T0 while the instance still runs. Ten
    minutes on, the stop is re-issued — one act, 600 s after the transition began."""
    mid = rig.machine(state="STOPPING", intent="STOPPED", state_changed_at=T0)
    net = StuckTransition(
        rig.sessions,
        rig.lease,
        rig.clock,
        rig.client,
        StuckPolicy(stuck_after=timedelta(minutes=10)),
        calls=rig.calls,
        instruments=rig.probe.instruments,
    )
    net.run(rig.at(599))
    assert rig.latencies() == {}
    net.run(rig.at(600))
    rig.settle()
    assert machine(rig.sessions, mid).state == "STOPPED"
    assert rig.latencies() == {"stuck_transition": (1, 600.0)}
