"""The money chain end to end (DESIGN §4): idle scanner → auto-stop → auto-destroy, over
real gRPC to a scripted agent and provisioner, on both stores."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select, text

from gpufleet.common.db.models import Failure, Incident
from gpufleet.common.leadership import LeaderLease
from tests.integration.reaper.conftest import Chain
from tests.support import tls
from tests.support.fleet_rows import add_attempt, add_machine, machine
from tests.support.scripted_services import serve_agent

FIVE_MIN = timedelta(minutes=5)
TWO_HOURS = timedelta(hours=2)


@pytest.fixture(autouse=True)
def _healthy_workers(chain: Chain) -> None:
    # The money chain's machines have live workers: only idleness is under test here.
    chain.heartbeats = True


def test_quiet_arms_both_timers_once(chain: Chain) -> None:
    with serve_agent() as agent:
        agent.quiet()
        mid = add_machine(chain.sessions, chain.clock.now(), agent_address=agent.address)
        t0 = chain.clock.now()
        chain.tick()
        armed = machine(chain.sessions, mid)
        assert (armed.stop_due_at, armed.destroy_due_at) == (t0 + FIVE_MIN, t0 + TWO_HOURS)
        assert armed.probe_ok_at == t0
        for _ in range(3):
            chain.step(30)
        later = machine(chain.sessions, mid)
        # Later quiet samples never push the timers out.
        assert (later.stop_due_at, later.destroy_due_at) == (t0 + FIVE_MIN, t0 + TWO_HOURS)
        assert later.probe_ok_at == chain.clock.now()
        assert agent.sample_calls == 4
    assert chain.stats("idle_scanner").actions.get("arm") == 1


ALL_STATES = [
    "REQUESTED",
    "PROVISIONING",
    "BOOTING",
    "READY",
    "DRAINING",
    "STOPPING",
    "STOPPED",
    "STARTING",
    "DESTROYING",
    "WEIRD",
]


def test_traffic_clears_both_timers_in_every_recorded_state(chain: Chain) -> None:
    now = chain.clock.now()
    with serve_agent() as agent:
        agent.busy(requests=1)
        ids = {}
        for state in ALL_STATES:
            mid = add_machine(
                chain.sessions,
                now,
                agent_address=agent.address,
                stop_due_at=now + timedelta(minutes=1),
                destroy_due_at=now + timedelta(hours=1),
            )
            # Written straight into the row, as drift or a bug elsewhere would.
            with chain.sessions() as s, s.begin():
                s.execute(text("UPDATE machines SET state = :s WHERE id = :i"), {"s": state, "i": mid})
            ids[state] = mid
        chain.tick()
        for state, mid in ids.items():
            row = machine(chain.sessions, mid)
            assert (row.state, row.stop_due_at, row.destroy_due_at) == (state, None, None)
    assert chain.provisioner.ops() == []


@pytest.mark.parametrize("traffic", [{"gpu": 60.0}, {"running": 1}, {"requests": 4}])
def test_each_kind_of_traffic_disarms_an_armed_machine(chain: Chain, traffic: dict[str, float]) -> None:
    with serve_agent() as agent:
        agent.quiet()
        mid = add_machine(chain.sessions, chain.clock.now(), agent_address=agent.address)
        chain.tick()
        assert machine(chain.sessions, mid).stop_due_at is not None
        agent.busy(**traffic)  # type: ignore[arg-type]
        chain.step(30)
        row = machine(chain.sessions, mid)
        assert (row.stop_due_at, row.destroy_due_at) == (None, None)
        assert chain.stats("idle_scanner").actions["clear"] == 1
        # Quiet again: armed afresh from now.
        agent.quiet()
        chain.step(30)
        assert machine(chain.sessions, mid).stop_due_at == chain.clock.now() + FIVE_MIN


def test_stop_falls_due_first_then_destroy(chain: Chain) -> None:
    with serve_agent() as agent:
        agent.quiet()
        mid = add_machine(chain.sessions, chain.clock.now(), agent_address=agent.address)
        t0 = chain.clock.now()
        chain.tick()
        for _ in range(9):  # t0+30s ... t0+4m30s: not yet due
            chain.step(30)
        assert machine(chain.sessions, mid).state == "READY"
        assert chain.provisioner.ops() == []
        chain.step(30)  # t0+5m: stop is due
        stopped = machine(chain.sessions, mid)
        assert (stopped.state, stopped.intent) == ("STOPPED", "STOPPED")
        assert stopped.stop_due_at is None
        assert stopped.destroy_due_at == t0 + TWO_HOURS  # disk kept; destroy still ahead
        assert stopped.state_changed_by == "reaper"
        assert stopped.state_reason.startswith("stop done; auto_stop: idle, stop due at ")
        [stop] = chain.provisioner.ops("stop")
        assert (stop.machine_id, stop.provider_instance_id) == (mid, stopped.provider_instance_id)
        assert stop.request_id.startswith(f"stop:{mid}:")
        assert chain.provisioner.ops("destroy") == []

        agent.reachable = False  # the instance is stopped: its agent is gone
        chain.clock.advance(TWO_HOURS - FIVE_MIN - timedelta(seconds=30))
        chain.tick()
        assert machine(chain.sessions, mid).state == "STOPPED"
        chain.step(30)  # t0+2h
        gone = machine(chain.sessions, mid)
        assert (gone.state, gone.intent, gone.stop_due_at, gone.destroy_due_at) == (
            "DESTROYED",
            "DESTROYED",
            None,
            None,
        )
        assert gone.state_changed_by == "reaper"
        assert gone.state_reason.startswith("destroy done; auto_destroy: idle (STOPPED), destroy due at ")
        assert [c.op for c in chain.provisioner.ops()] == ["stop", "destroy"]

        samples = agent.sample_calls
        for _ in range(3):
            chain.step(30)
        assert agent.sample_calls == samples
        assert [c.op for c in chain.provisioner.ops()] == ["stop", "destroy"]


# The chain's own gap between a stop and its destroy (the settings' defaults).
STOPPED_FOR = TWO_HOURS - FIVE_MIN


def test_a_machine_stopped_with_no_destroy_timer_is_destroyed_after_the_chains_gap(chain: Chain) -> None:
    """A spot machine its provider stopped while it was busy (the sweeper's spot_stopped:
    STOPPED, intent STOPPED, no timer — it was never idle) bills its disk with no timer to
    end it. It falls due as a machine the chain stopped would: its stop plus the chain's gap.
    So does one left STOPPED by a start the provider refused (never observed this life: the
    start's intent cleared first_observed_at); its grace runs from its stop. One the money
    chain armed is still held to its own timer."""
    now = chain.clock.now()
    common: dict[str, object] = dict(
        state="STOPPED", intent="STOPPED", capacity_type="SPOT", state_changed_at=now, destroy_due_at=None
    )
    mid = add_machine(chain.sessions, now, **common)
    refused_start = add_machine(chain.sessions, now, **(common | {"first_observed_at": None}))
    armed = add_machine(chain.sessions, now, **(common | {"destroy_due_at": now + TWO_HOURS}))
    chain.clock.advance(STOPPED_FOR - timedelta(seconds=30))
    chain.tick()
    assert machine(chain.sessions, mid).state == "STOPPED"
    assert chain.provisioner.ops() == []
    chain.step(30)  # stopped for the gap: due
    gone = machine(chain.sessions, mid)
    assert (gone.state, gone.intent) == ("DESTROYED", "DESTROYED")
    assert (gone.stop_due_at, gone.destroy_due_at) == (None, None)
    assert gone.state_reason.startswith(
        f"destroy done; auto_destroy: stopped since {now:%Y-%m-%d %H:%M:%S} with no destroy timer"
    )
    assert machine(chain.sessions, refused_start).state == "DESTROYED"
    assert sorted(op.machine_id for op in chain.provisioner.ops("destroy")) == sorted([mid, refused_start])
    assert machine(chain.sessions, armed).state == "STOPPED"  # its timer is 5 min further off
    assert chain.stats("auto_destroy").refusals == {}


def test_a_destroyed_machine_is_never_sampled_armed_or_called(chain: Chain) -> None:
    now = chain.clock.now()
    with serve_agent() as agent:
        agent.quiet()
        mid = add_machine(
            chain.sessions,
            now,
            state="DESTROYED",
            intent="DESTROYED",
            agent_address=agent.address,
            stop_due_at=now - timedelta(hours=1),
            destroy_due_at=now - timedelta(minutes=1),
        )
        quiet_dead = add_machine(
            chain.sessions, now, state="DESTROYED", intent="DESTROYED", agent_address=agent.address
        )
        for _ in range(3):
            chain.step(30)
        assert agent.sample_calls == 0
    assert chain.provisioner.ops() == []
    assert machine(chain.sessions, mid).stop_due_at == now - timedelta(hours=1)
    assert machine(chain.sessions, quiet_dead).stop_due_at is None
    assert machine(chain.sessions, quiet_dead).probe_ok_at is None
    # Excluded by the query, not refused one by one.
    assert chain.stats("auto_stop").refusals == {}
    assert chain.stats("auto_destroy").refusals == {}


def _ledger(chain: Chain, machine_id: str) -> list[Failure]:
    with chain.sessions() as s:
        return list(s.execute(select(Failure).where(Failure.machine_id == machine_id)).scalars())


def test_a_failing_stop_stays_stopping_with_a_ledger_row(chain: Chain) -> None:
    now = chain.clock.now()
    mid = add_machine(
        chain.sessions, now, stop_due_at=now - timedelta(seconds=1), destroy_due_at=now + TWO_HOURS
    )
    chain.provisioner.fail_next("stop", "TRANSIENT")
    chain.tick()
    row = machine(chain.sessions, mid)
    assert (row.state, row.intent) == ("STOPPING", "STOPPED")
    [entry] = _ledger(chain, mid)
    assert (entry.failure_class, entry.detector, entry.outcome) == (
        "provider_call_failed",
        "auto_stop",
        "ALERT_HUMAN",
    )
    assert "TRANSIENT" in entry.details
    with chain.sessions() as s:
        assert s.execute(select(Incident.machine_id)).scalars().all() == [mid]
    for _ in range(3):  # never silently retried: the stuck-transition watchdog owns it now
        chain.step(30)
    assert len(chain.provisioner.ops("stop")) == 1
    assert machine(chain.sessions, mid).state == "STOPPING"


def test_a_failing_destroy_stays_destroying_with_a_ledger_row(chain: Chain) -> None:
    now = chain.clock.now()
    mid = add_machine(
        chain.sessions, now, state="STOPPED", intent="STOPPED", destroy_due_at=now - timedelta(seconds=1)
    )
    chain.provisioner.fail_next("destroy", "AUTH_FAILED")
    chain.tick()
    row = machine(chain.sessions, mid)
    assert (row.state, row.intent, row.destroy_due_at) == (
        "DESTROYING",
        "DESTROYED",
        now - timedelta(seconds=1),
    )
    [entry] = _ledger(chain, mid)
    assert (entry.failure_class, entry.detector) == ("provider_call_failed", "auto_destroy")
    chain.step(30)
    assert len(chain.provisioner.ops("destroy")) == 1
    assert chain.stats("auto_destroy").actions == {"destroy_failed": 1}


@pytest.mark.parametrize("attempt_state", ["STARTING", "RUNNING"])
def test_a_pinned_machine_is_not_stopped(chain: Chain, attempt_state: str) -> None:
    now = chain.clock.now()
    pinned = add_machine(chain.sessions, now, stop_due_at=now - timedelta(seconds=1))
    add_attempt(chain.sessions, now, pinned, state=attempt_state)
    done = add_machine(chain.sessions, now, stop_due_at=now - timedelta(seconds=1))
    add_attempt(chain.sessions, now, done, state="SUCCEEDED")  # a finished attempt pins nothing
    chain.tick()
    assert machine(chain.sessions, pinned).state == "READY"
    assert machine(chain.sessions, done).state == "STOPPED"
    assert [c.machine_id for c in chain.provisioner.ops()] == [done]
    assert chain.stats("auto_stop").refusals == {"WORK_PINNED": 1}


def test_a_warm_machine_is_kept_until_its_pool_releases_it(chain: Chain) -> None:
    now = chain.clock.now()
    warm = add_machine(chain.sessions, now, warm_held=True, stop_due_at=now - timedelta(seconds=1))
    # A running machine whose only due timer is its destroy timer: held too.
    idle = add_machine(chain.sessions, now, warm_held=True, destroy_due_at=now - timedelta(seconds=1))
    chain.tick()
    assert machine(chain.sessions, warm).state == "READY"
    assert machine(chain.sessions, idle).state == "READY"
    assert chain.provisioner.ops() == []
    assert chain.stats("auto_stop").refusals == {"WARM_CAPACITY": 1}
    assert chain.stats("auto_destroy").refusals == {"WARM_CAPACITY": 1}
    # The pool idle release clears the pin: the money chain stops it as any quiet machine.
    with chain.sessions() as s, s.begin():
        s.execute(text("UPDATE machines SET warm_held = false WHERE id = :i"), {"i": warm})
    chain.step(30)
    assert machine(chain.sessions, warm).state == "STOPPED"


def test_a_registered_machine_is_never_stopped_or_destroyed(chain: Chain) -> None:
    now = chain.clock.now()
    with serve_agent() as agent:
        agent.quiet()
        running = add_machine(
            chain.sessions,
            now,
            origin="REGISTERED",
            agent_address=agent.address,
            stop_due_at=now - timedelta(hours=1),
            destroy_due_at=now - timedelta(minutes=1),
        )
        idle = add_machine(
            chain.sessions,
            now,
            origin="REGISTERED",
            state="STOPPED",
            intent="STOPPED",
            destroy_due_at=now - timedelta(minutes=1),
        )
        unmanaged = add_machine(chain.sessions, now, managed=False, agent_address=agent.address)
        for _ in range(3):
            chain.step(30)
        assert agent.sample_calls == 0
    assert chain.provisioner.ops() == []
    assert machine(chain.sessions, running).state == "READY"
    assert machine(chain.sessions, idle).state == "STOPPED"
    assert machine(chain.sessions, unmanaged).stop_due_at is None
    assert chain.stats("auto_stop").refusals == {"NOT_OURS": 3}
    assert chain.stats("auto_destroy").refusals == {"NOT_OURS": 6}


def test_a_machine_inside_its_grace_window_is_not_stopped(chain: Chain) -> None:
    now = chain.clock.now()
    mid = add_machine(
        chain.sessions,
        now,
        first_observed_at=now - timedelta(minutes=2),
        stop_due_at=now - timedelta(seconds=1),
    )
    chain.tick()
    assert machine(chain.sessions, mid).state == "READY"
    chain.step(8 * 60)  # 10 minutes after first observation
    assert machine(chain.sessions, mid).state == "STOPPED"


def test_an_unreachable_agent_changes_no_timer_and_marks_the_probe_channel(chain: Chain) -> None:
    now = chain.clock.now()
    with serve_agent() as agent:
        agent.reachable = False
        mid = add_machine(
            chain.sessions,
            now,
            agent_address=agent.address,
            probe_ok_at=now - timedelta(minutes=1),
            stop_due_at=now + timedelta(minutes=3),
            destroy_due_at=now + timedelta(hours=1),
        )
        chain.tick()
        row = machine(chain.sessions, mid)
        assert (row.stop_due_at, row.destroy_due_at) == (now + timedelta(minutes=3), now + timedelta(hours=1))
        assert row.probe_failed_since == now
        chain.step(30)
        assert machine(chain.sessions, mid).probe_failed_since == now  # set once, not moved
        agent.reachable = True
        agent.busy(requests=1)
        chain.step(30)
        row = machine(chain.sessions, mid)
        assert (row.probe_ok_at, row.probe_failed_since) == (chain.clock.now(), None)
        assert (row.stop_due_at, row.destroy_due_at) == (None, None)


def test_an_agent_with_no_listener_is_no_sample(chain: Chain) -> None:
    now = chain.clock.now()
    mid = add_machine(chain.sessions, now, agent_address="127.0.0.1:1", first_observed_at=None)
    chain.tick()
    row = machine(chain.sessions, mid)
    assert (row.stop_due_at, row.probe_failed_since, row.first_observed_at) == (None, now, None)


def test_first_contact_records_first_observation(chain: Chain) -> None:
    now = chain.clock.now()
    with serve_agent() as agent:
        agent.quiet()
        mid = add_machine(
            chain.sessions, now, agent_address=agent.address, state="BOOTING", first_observed_at=None
        )
        chain.tick()
        chain.step(30)
    assert machine(chain.sessions, mid).first_observed_at == now


def test_a_fenced_ex_leader_does_not_stop(chain: Chain) -> None:
    now = chain.clock.now()
    mid = add_machine(chain.sessions, now, stop_due_at=now - timedelta(seconds=1))
    assert chain.lease.try_acquire()
    chain.clock.advance(timedelta(seconds=16))  # our lease lapsed while we were "paused"
    other = LeaderLease("reaper", "other-replica", chain.clock, chain.sessions, ttl_s=15)
    assert other.try_acquire()
    chain.ticker.run_due()  # wakes believing it still leads
    assert chain.provisioner.ops() == []
    assert machine(chain.sessions, mid).state == "READY"


def test_a_stopped_spot_machine_adds_its_running_time_to_its_spot_history(chain: Chain) -> None:
    """Pre-emption rate = pre-emptions / spot hours: every spot hour counts, not only the
    hours that ended in a pre-emption."""
    with serve_agent() as agent:
        agent.quiet()
        spot = add_machine(
            chain.sessions,
            chain.clock.now(),
            agent_address=agent.address,
            capacity_type="SPOT",
            spot_seconds=600.0,
        )
        on_demand = add_machine(chain.sessions, chain.clock.now(), agent_address=agent.address)
        observed = machine(chain.sessions, spot).first_observed_at
        chain.tick()
        for _ in range(10):
            chain.step(30)
        stopped = machine(chain.sessions, spot)
        assert stopped.state == "STOPPED"
        assert observed is not None
        ran = (stopped.state_changed_at - observed).total_seconds()
        assert stopped.spot_seconds == pytest.approx(600.0 + ran, abs=1.0)
        assert machine(chain.sessions, on_demand).spot_seconds == 0.0


def test_a_pass_never_waits_on_its_slowest_machine(chain: Chain) -> None:
    """Three frozen agents (their sample hangs) beside three quiet ones: one pass takes the
    pass deadline, not three agent deadlines; the quiet machines are armed in that pass; a
    frozen machine changes no timer, and is not sampled again until its call returns."""
    import time

    from gpufleet.reaper.idle_scanner import GrpcAgentSampler, IdlePolicy, IdleScanner

    with (
        serve_agent() as f1,
        serve_agent() as f2,
        serve_agent() as f3,
        serve_agent() as quiet,
    ):
        quiet.quiet()
        frozen = [f1, f2, f3]
        for agent in frozen:
            agent.freeze()
        now = chain.clock.now()
        frozen_ids = [add_machine(chain.sessions, now, agent_address=a.address) for a in frozen]
        quiet_ids = [add_machine(chain.sessions, now, agent_address=quiet.address) for _ in range(3)]
        agent_deadline_s = 8.0
        scanner = IdleScanner(
            chain.sessions,
            chain.lease,
            GrpcAgentSampler(tls.transport("reaper"), window=timedelta(0), timeout_s=agent_deadline_s),
            IdlePolicy(stop_after=FIVE_MIN, destroy_after=TWO_HOURS, gpu_busy_percent=5.0),
            concurrency=4,
            pass_deadline_s=1.0,
        )
        try:
            assert chain.lease.try_acquire()
            t0 = time.monotonic()
            report = scanner.run(now)
            took = time.monotonic() - t0
            assert took < agent_deadline_s / 2, f"the pass waited {took:.1f}s on frozen agents"
            assert report.actions["sample_past_pass_deadline"] >= 1
            for mid in frozen_ids:
                assert machine(chain.sessions, mid).stop_due_at is None
            # The quiet machines were sampled and armed in that same pass.
            assert all(machine(chain.sessions, mid).stop_due_at for mid in quiet_ids)
            # The next pass: the frozen machines' calls are still running, so they are not
            # sampled twice, and the pass does not wait for them either.
            t0 = time.monotonic()
            again = scanner.run(chain.clock.now())
            assert time.monotonic() - t0 < agent_deadline_s / 2
            assert again.actions["sample_still_running"] == len(frozen_ids)
            assert all(machine(chain.sessions, mid).stop_due_at is None for mid in frozen_ids)
        finally:
            for agent in frozen:
                agent.thaw()
            scanner.close()
