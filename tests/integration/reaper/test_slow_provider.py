"""A provider whose stop hangs delays only its own machine (issue 22, the reaper's half).

Real parts: the reaper's nets as ``main.build_watchdogs`` wires them, run by the real
Ticker under the real lease, on PostgreSQL; the real ProvisionerService over gRPC, its sim
driver holding one machine's StopInstance as a cloud's long stop operation holds it;
scripted agents over gRPC answering the idle scanner's samples. The pass that claims the
stop returns at once; the idle scanner keeps sampling every running machine; the other
machine's stop completes; the stuck-transition net does not send the held call again;
and a graceful stop waits for the call and records its answer under the lease.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import datetime, timedelta

import pytest
from sqlalchemy import update

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.models import LeaderLease, Machine
from gpufleet.common.grpcserver import create_server
from gpufleet.provisioner.drivers.base import InstanceStatus
from gpufleet.reaper.main import Reaper
from gpufleet.reaper.settings import Settings
from tests.integration.reaper.conftest import Chain, wire_reaper
from tests.support import tls
from tests.support.fleet_rows import add_machine, machine
from tests.support.held_calls import HeldProvisioner, serve_held_provisioner
from tests.support.scripted_services import ScriptedAgent, serve_agent

# Far below how long the held stop is held (60 s) and the client's deadline for it.
PROMPT_S = 5.0


class Fleet:
    """Two idle machines whose stop is due, two busy ones, one stop held at the provider."""

    def __init__(
        self, chain: Chain, held: HeldProvisioner, quiet: ScriptedAgent, busy: ScriptedAgent
    ) -> None:
        self.chain = chain
        self.held = held
        self.busy_agent = busy
        now = chain.clock.now()
        due = {"stop_due_at": now - timedelta(seconds=1), "destroy_due_at": now + timedelta(hours=2)}
        self.hung = self._machine("m-hung", quiet, **due)
        self.other = self._machine("m-other", quiet, **due)
        self.serving = [self._machine(f"m-serving-{n}", busy) for n in range(2)]
        held.driver.hold("stop", self.hung)

    def _machine(self, machine_id: str, agent: ScriptedAgent, **values: object) -> str:
        mid = add_machine(
            self.chain.sessions, self.chain.clock.now(), id=machine_id, agent_address=agent.address
        )
        instance = self.held.create(mid)
        with self.chain.sessions() as s, s.begin():
            s.execute(
                update(Machine)
                .where(Machine.id == mid)
                .values(provider_instance_id=instance.provider_instance_id, **values)
            )
        return mid

    def state(self, machine_id: str) -> tuple[str, str]:
        row = machine(self.chain.sessions, machine_id)
        return row.state, row.intent

    def timed_pass(self, seconds: float) -> float:
        """Advance the clock, run every due net (not waiting for their calls): real seconds."""
        t0 = time.monotonic()
        self.chain.step(seconds, settle=False)
        return time.monotonic() - t0


def eventually(check: Callable[[], bool], what: str, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.02)


@pytest.fixture
def fleet(db_url: str) -> Iterator[Fleet]:
    clock = ManualClock()
    with ExitStack() as stack:
        held = stack.enter_context(serve_held_provisioner(clock))
        quiet = stack.enter_context(serve_agent())
        busy = stack.enter_context(serve_agent())
        quiet.quiet()
        busy.busy(requests=3)
        # The client waits longer than the hold: the call hangs, it does not time out.
        chain = stack.enter_context(wire_reaper(db_url, clock, held.address, held, provider_timeout_s=120.0))
        chain.heartbeats = True
        yield Fleet(chain, held, quiet, busy)


def test_a_hung_stop_holds_up_no_pass_and_no_other_machine(fleet: Fleet) -> None:
    chain, driver = fleet.chain, fleet.held.driver
    assert fleet.timed_pass(0) < PROMPT_S  # every net's first pass, auto-stop claiming both
    assert driver.wait_held("stop", fleet.hung)
    assert fleet.state(fleet.hung) == ("STOPPING", "STOPPED")  # claimed, intent first
    eventually(lambda: not chain.calls.busy(fleet.other), "the other machine's stop answered")
    assert fleet.state(fleet.other) == ("STOPPED", "STOPPED")
    statuses = {i.machine_id: i.status for i in driver.cloud.all_instances()}
    assert statuses[fleet.other] is InstanceStatus.STOPPED
    assert statuses[fleet.hung] is InstanceStatus.RUNNING
    assert chain.calls.busy(fleet.hung)

    # The idle scanner's next pass samples every running machine while the stop hangs.
    sampled_before = fleet.busy_agent.sample_calls
    assert fleet.timed_pass(30) < PROMPT_S
    now = chain.clock.now()
    assert fleet.busy_agent.sample_calls - sampled_before == len(fleet.serving)
    assert [machine(chain.sessions, m).probe_ok_at for m in fleet.serving] == [now] * len(fleet.serving)
    assert chain.stats("auto_stop").actions == {"stop": 1}  # the other's answer, counted here

    # Past the stuck-transition threshold, the call is still out: slow, not stuck. Neither
    # read nor re-issued — the same stop is never out twice.
    assert fleet.timed_pass(11 * 60) < PROMPT_S
    assert chain.stats("stuck_transition").actions == {"call_in_flight": 1}
    assert driver.calls_of(fleet.hung) == ["stop"]
    assert fleet.state(fleet.hung) == ("STOPPING", "STOPPED")

    driver.release()
    chain.settle()
    assert fleet.state(fleet.hung) == ("STOPPED", "STOPPED")
    assert driver.calls_of(fleet.hung) == ["stop"] and driver.calls_of(fleet.other) == ["stop"]
    chain.step(30)
    assert chain.stats("auto_stop").actions == {"stop": 2}
    assert (machine(chain.sessions, fleet.hung).state_reason or "").startswith("stop done")


def test_a_stop_waiting_for_a_worker_is_not_re_issued_either(db_url: str) -> None:
    """One worker, held: the second machine's claimed stop waits its turn, visibly STOPPING,
    and the stuck-transition net leaves it to the call that is queued."""
    clock = ManualClock()
    with (
        serve_held_provisioner(clock) as held,
        serve_agent() as quiet,
        serve_agent() as busy,
        wire_reaper(
            db_url, clock, held.address, held, provider_timeout_s=120.0, provider_call_workers=1
        ) as chain,
    ):
        quiet.quiet()
        busy.busy(requests=1)
        chain.heartbeats = True
        fleet = Fleet(chain, held, quiet, busy)
        assert fleet.timed_pass(0) < PROMPT_S
        assert held.driver.wait_held("stop", fleet.hung)
        assert chain.calls.pending() == 2
        assert fleet.state(fleet.other) == ("STOPPING", "STOPPED")
        assert fleet.timed_pass(11 * 60) < PROMPT_S
        assert chain.stats("stuck_transition").actions == {"call_in_flight": 2}
        assert held.driver.calls_of(fleet.other) == []
        held.driver.release()
        chain.settle()
        assert fleet.state(fleet.hung) == fleet.state(fleet.other) == ("STOPPED", "STOPPED")
        assert held.driver.calls_of(fleet.hung) == held.driver.calls_of(fleet.other) == ["stop"]


def _lease_expires(chain: Chain) -> datetime:
    with chain.sessions() as s:
        row = s.get(LeaderLease, "reaper")
        assert row is not None
        return row.expires_at


def test_a_graceful_stop_records_the_answer_of_a_call_in_flight_before_giving_up_the_lease(
    fleet: Fleet, db_url: str
) -> None:
    chain, driver = fleet.chain, fleet.held.driver
    engine = make_engine(db_url)
    server = create_server("127.0.0.1:0", [], transport=tls.transport("reaper"))
    reaper = Reaper(
        name="reaper",
        settings=Settings(database_url=db_url),
        engine=engine,
        lease=chain.lease,
        ticker=chain.ticker,
        server=server,
        others=(chain.calls,),
        calls=chain.calls,
        drain_s=30.0,
    )
    reaper.start_loops()  # leads, and runs every net once: the hung stop goes out
    assert driver.wait_held("stop", fleet.hung)
    threading.Timer(0.5, driver.release).start()  # the provider answers while we stop
    reaper.close(grace=0)
    assert fleet.state(fleet.hung) == ("STOPPED", "STOPPED")  # written under the lease
    assert fleet.state(fleet.other) == ("STOPPED", "STOPPED")
    assert _lease_expires(chain) <= chain.clock.now()  # then given up
    assert not chain.calls.accepting
