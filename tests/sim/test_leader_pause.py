"""A paused reaper leader: it holds its lease until the lease runs out (``lease_ttl_s``, the
reaper's setting) and no reaper net acts meanwhile; then its standby takes over and the
nets go on. A pause shorter than the lease ends with the same leader going on."""

from __future__ import annotations

import math

from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING

SCRIPT = Script(
    offering=OFFERING, workspaces=(("ws", "creator"),), jobs=(ScriptedJob(10.0, "ws", "clip", 60.0),)
)
TTL_S = ReaperSettings().lease_ttl_s


def _stopping(pause_at: float | None = None, pause_s: float = 0.0) -> tuple[Sim, float]:
    """When the idle machine's auto-stop claims it, with the reaper's leader paused at
    ``pause_at`` for ``pause_s``."""
    sim = Sim(SimConfig(days=2 / 24, machines=1, tick_s=10.0, script=SCRIPT))
    if pause_at is not None:
        sim.q.at(pause_at, lambda: sim._outage("pause", pause_s))
    sim.run()
    assert sim.history is not None
    return sim, next(t for t, what, _, state in sim.history if what == "machine" and state == "STOPPING")


def test_no_reaper_net_acts_until_the_paused_leaders_lease_runs_out() -> None:
    _, unpaused = _stopping()
    sim, paused = _stopping(unpaused - 5.0, 100.0)
    back = unpaused - 5.0 + TTL_S
    # Not at its own time (the leader is paused), not when the leader wakes (100 s later):
    # at the standby's first auto-stop pass once the lease has run out.
    assert back <= paused <= back + sim.every["auto_stop"]
    assert paused < unpaused - 5.0 + 100.0
    (leadership,) = [f for f in sim.failures if f.cls == "leader_paused"]
    assert leadership.caught_at == back


def test_a_pause_shorter_than_the_lease_ends_with_the_same_leader() -> None:
    _, unpaused = _stopping()
    sim, paused = _stopping(unpaused - 5.0, TTL_S / 3)
    back = unpaused - 5.0 + TTL_S / 3
    assert back <= paused <= back + sim.every["auto_stop"]


def _stopped_after_pause(pause_s: float) -> tuple[Sim, float, float]:
    """The idle machine's stop claimed, and its leader paused for ``pause_s`` while the stop's
    call is out (the script's calls take a second): when the claim was made, when the row
    was STOPPED."""
    _, claimed = _stopping()
    sim, again = _stopping(claimed + 0.5, pause_s)
    assert again == claimed  # the pause began after the claim
    assert sim.history is not None
    stopped = next(t for t, what, _, state in sim.history if what == "machine" and state == "STOPPED")
    return sim, claimed, stopped


def test_a_leader_paused_past_its_lease_never_writes_its_stops_answer() -> None:
    # The provider stopped the instance, but the deposed leader's write is fenced: the row
    # stays STOPPING until the new leader's stuck-transition net finds it stopped.
    sim, claimed, stopped = _stopped_after_pause(100.0)
    (lost,) = [f for f in sim.failures if f.cls == "answer_lost"]
    assert lost.at == claimed + 1.0
    assert (lost.caught_at, lost.caught_by) == (stopped, "stuck_transition")
    assert stopped > claimed + 100.0


def test_a_leader_paused_within_its_lease_writes_its_stops_answer_when_it_wakes() -> None:
    sim, claimed, stopped = _stopped_after_pause(TTL_S / 3)
    # (An outage ends on a whole second: the woken leader's loops then add up exactly.)
    assert stopped == math.ceil(claimed + 0.5 + TTL_S / 3)
    assert not [f for f in sim.failures if f.cls == "answer_lost"]
