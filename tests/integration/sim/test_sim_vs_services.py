"""The simulator runs the system (issue #26): one script — its jobs, boots and failures —
told to the simulator and to the real services on PostgreSQL gives the same histories of
machines and jobs, each state at the same time to the resolution of the cadence that
writes it.

The services' side is ``services_world`` (the real fleet tick, worker service, reaper nets
and sweeper passes on one manual clock; the machines' agents and workers played as the
script has them); the simulator's is ``Sim`` with ``SimConfig.script``. A rule the
simulator restated and got wrong, or one the services changed without it, shows here as a
state one side took and the other did not, or took a cadence later.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import pytest

from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import Sim
from tests.conftest import fresh_postgres_url
from tests.integration.sim.services_world import History, services_world
from tests.support.postgres import PostgresServer
from tests.support.sim_script import OFFERING

pytestmark = pytest.mark.postgres

TICK_S, MACHINES = 10.0, 4


def _script() -> Script:
    """Five clips and a film in one workspace, on a fleet of at most four machines: two
    created at once for the first clips, a third for a clip waiting behind them; the second
    machine's worker dies mid-job (its attempt's lease runs out, the job runs again after
    its back-off); quiet machines stopped by the money chain, one started again for a later
    job, and a film that needs a whole machine."""
    jobs = (
        (10, "clip", 300),
        (10, "clip", 600),
        (15, "clip", 200),
        (400, "clip", 300),
        (1300, "clip", 120),
        (1500, "film", 400),
    )
    return Script(
        offering=OFFERING,
        workspaces=(("ws-a", "creator"),),
        jobs=tuple(ScriptedJob(float(at), "ws-a", kind, float(run)) for at, kind, run in jobs),
        # The services' sim cloud answers a call at the clock reading it was made at.
        call_s=0.0,
        # Off the heartbeat's grid and away from any job's end, so that no side's step
        # decides whether a last report or a completion made it out.
        worker_deaths=((2, 153.0),),
    )


def _by_subject(history: History) -> dict[tuple[str, str], list[tuple[float, str]]]:
    """Each machine's and job's moves in order (a state written again is no move: the
    tick's QUEUED events say why a job still waits)."""
    out: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)
    for t, what, ident, state in history:
        seq = out[(what, ident)]
        if not seq or seq[-1][1] != state:
            seq.append((t, state))
    return out


def _stories(history: History, what: str) -> list[list[tuple[float, str]]]:
    """Each job's (or machine's) states, in order of arrival (creation), then of id."""
    subjects = [(seq, ident) for (w, ident), seq in _by_subject(history).items() if w == what]
    return [seq for seq, _ in sorted(subjects, key=lambda x: (x[0][0][0], x[1]))]


def differences(sim: History, services: History, tolerance_s: float) -> list[str]:
    """What one side did that the other did not, or did more than ``tolerance_s`` apart:
    each job, and each machine (the n-th created on one side against the n-th on the
    other)."""
    out: list[str] = []
    for what in ("job", "machine"):
        a_all, b_all = _stories(sim, what), _stories(services, what)
        if len(a_all) != len(b_all):
            out.append(f"{what}s: {len(a_all)} in the simulator, {len(b_all)} in the services")
        for i, (a, b) in enumerate(zip(a_all, b_all, strict=False)):
            if [s for _, s in a] != [s for _, s in b]:
                out.append(f"{what} {i + 1}: simulator {a}, services {b}")
            elif any(abs(ta - tb) > tolerance_s for (ta, _), (tb, _) in zip(a, b, strict=True)):
                out.append(f"{what} {i + 1} at other times: simulator {a}, services {b}")
    return out


def _broken_boots() -> Script:
    """A pool that keeps one machine warm, and boots that go wrong: of the two machines made
    for a burst of work, one never gets an agent (the provision deadline's), the other's
    start-up never completes (the boot failure net's). The scale step counts both as
    capacity on its way until they are destroyed, so the burst drains through the warm
    machine; the pool's idle time lets that one go at the end."""
    jobs = (*((300 + i, "clip", 900) for i in range(5)), (1500, "short_episode", 600))
    return Script(
        offering=OFFERING,
        workspaces=(("ws-b", "studio"),),
        jobs=tuple(ScriptedJob(float(at), "ws-b", kind, float(run)) for at, kind, run in jobs),
        call_s=0.0,
        stalls=(2,),
        boot_hangs=(3,),
    )


def _lost_and_taken() -> Script:
    """Running machines that go wrong: the control plane loses its path to the first
    machine's agent for a quarter of an hour (its worker still reports and its long job
    runs on; the lost detector marks it, so its free slot takes no new job), and the
    provider takes the second machine's instance back mid-job (the inventory reconcile
    finds it gone; its two jobs run again on a new machine)."""
    jobs = ((10, "clip", 300), (10, "clip", 1500), (20, "clip", 900), (20, "clip", 900), (700, "clip", 300))
    return Script(
        offering=OFFERING,
        workspaces=(("ws-c", "creator"),),
        jobs=tuple(ScriptedJob(float(at), "ws-c", kind, float(run)) for at, kind, run in jobs),
        call_s=0.0,
        path_drops=((1, 95.0, 900.0),),
        preemptions=((2, 305.0),),
    )


def _stuck_and_overlong() -> Script:
    """A worker that wedges mid-job (alive, its GPU stuck busy, reporting no more: the
    lease ends its attempt, the job runs again, and went silent destroys the machine the
    money chain would never stop), and a clip that runs past its kind's hour (the tick's
    time limit ends it TIMED_OUT)."""
    jobs = ((10, "clip", 4000), (10, "clip", 600), (600, "clip", 300))
    return Script(
        offering=OFFERING,
        workspaces=(("ws-d", "creator"),),
        jobs=tuple(ScriptedJob(float(at), "ws-d", kind, float(run)) for at, kind, run in jobs),
        call_s=0.0,
        worker_wedges=((1, 303.0),),
    )


# Ends at 930 s: a pass of the 30 s tick, not of the 60 s nets, the 300 s orphan sweep or
# the 900 s pool idle release.
RESTART_DOWN_S = 330.0


def _restart() -> Script:
    """A control-plane restart (a deploy) of five minutes mid-story: a job that arrives
    meanwhile waits for the new leader's first tick; one whose machine's worker died before
    it has its lease run out meanwhile, ended at that tick and run again after its back-off;
    one ends meanwhile, recorded by the worker service (on the replica still up). The
    restart ends off the grid of every loop but the tick's (15.5 min): the new processes
    run each loop at once, then every cadence from then, and so does the simulator."""
    jobs = ((10, "clip", 300), (10, "clip", 700), (10, "clip", 900), (650, "clip", 200))
    return Script(
        offering=OFFERING,
        workspaces=(("ws-e", "creator"),),
        jobs=tuple(ScriptedJob(float(at), "ws-e", kind, float(run)) for at, kind, run in jobs),
        call_s=0.0,
        worker_deaths=((2, 415.0),),
        restarts=((600.0, RESTART_DOWN_S),),
    )


# (script, warm target, minutes told)
SCENARIOS = {
    "restart": (_restart, 0, 45.0),
    "stuck_and_overlong": (_stuck_and_overlong, 0, 75.0),
    "quiet": (_script, 0, 40.0),
    "broken_boots": (_broken_boots, 1, 95.0),
    "lost_and_taken": (_lost_and_taken, 0, 60.0),
}


def _simulate(name: str, settings: NetSettings | None = None) -> Sim:
    script, warm, minutes = SCENARIOS[name]
    config = SimConfig(
        days=minutes * 60 / 86400.0,
        machines=MACHINES,
        seed=1,
        tick_s=TICK_S,
        warm_target=warm,
        script=script(),
    )
    sim = Sim(config, "nets", settings=settings)
    sim.run()
    assert sim.history is not None
    return sim


@pytest.fixture(scope="module")
def told(postgres: PostgresServer) -> Callable[[str], History]:
    """Each script told to the services (once for the module, when first asked for)."""
    done: dict[str, History] = {}

    def tell(name: str) -> History:
        if name not in done:
            script, warm, minutes = SCENARIOS[name]
            timing = SimConfig().timing
            with services_world(
                fresh_postgres_url(postgres),
                script(),
                machines=MACHINES,
                tick_s=TICK_S,
                heartbeat_s=timing.heartbeat_s,
                dispatch_s=timing.dispatch_s,
                warm_target=warm,
            ) as world:
                done[name] = world.run(minutes * 60)
        return done[name]

    return tell


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_simulator_and_the_services_tell_the_same_story(
    told: Callable[[str], History], name: str
) -> None:
    services = told(name)
    sim = _simulate(name).history
    assert sim is not None
    assert differences(sim, services, tolerance_s=TICK_S) == []
    # ... and the story is the one the script tells, not an empty one.
    jobs = [[s for _, s in seq] for seq in _stories(services, "job")]
    machines = [[s for _, s in seq] for seq in _stories(services, "machine")]
    script = SCENARIOS[name][0]()
    if name != "stuck_and_overlong":
        assert [seq[-1] for seq in jobs] == ["SUCCEEDED"] * len(script.jobs)
    if name == "quiet":
        # One job ran twice (its first machine's worker died under it); machines were
        # created, stopped for being quiet and one started again.
        assert sum(1 for seq in jobs if seq.count("DISPATCHING") == 2) == 1
        assert len(machines) >= 3
        assert all("STOPPED" in seq for seq in machines)
        assert any("STARTING" in seq for seq in machines)
    elif name == "stuck_and_overlong":
        # The wedged machine destroyed by went silent (the money chain saw a busy GPU), its
        # two jobs run again; the overlong clip ended at its limit, the others succeeded.
        assert machines[0] == ["PROVISIONING", "BOOTING", "READY", "DESTROYING", "DESTROYED"]
        assert sum(1 for seq in jobs if seq.count("DISPATCHING") == 2) == 2
        assert [seq[-1] for seq in jobs] == ["TIMED_OUT", "SUCCEEDED", "SUCCEEDED"]
    elif name == "restart":
        # The job that arrived during the restart dispatched at the new leader's first tick;
        # the dead worker's job ended there (its lease ran out meanwhile) and ran again.
        queued, dispatched = jobs[3][:2], _stories(services, "job")[3][1]
        back = 600.0 + RESTART_DOWN_S
        assert queued == ["QUEUED", "DISPATCHING"] and dispatched[0] == back, dispatched
        assert jobs[2] == [
            "QUEUED",
            "DISPATCHING",
            "RUNNING",
            "QUEUED",
            "DISPATCHING",
            "RUNNING",
            "SUCCEEDED",
        ]
        assert _stories(services, "job")[2][3][0] == back
    elif name == "lost_and_taken":
        # The taken instance's machine found gone (never through DESTROYING: no call made
        # it), its two jobs run again; a fourth machine made for the last job, though the
        # first had a free slot: it was marked lost while its path was down.
        assert machines[1] == ["PROVISIONING", "BOOTING", "READY", "DESTROYED"]
        assert sum(1 for seq in jobs if seq.count("DISPATCHING") == 2) == 2
        assert len(machines) == 4
    else:
        # A warm machine from the first tick, held through the pool's idle time (the money
        # chain refused it) and stopped once the pool idle release let it go; the stalled
        # and the hung boot destroyed, never ready.
        assert machines[0] == ["PROVISIONING", "BOOTING", "READY", "STOPPING", "STOPPED"]
        assert machines[1:] == [["PROVISIONING", "BOOTING", "DESTROYING", "DESTROYED"]] * 2


def test_a_rule_the_simulator_got_wrong_shows(told: Callable[[str], History]) -> None:
    name = "quiet"
    services = told(name)
    # The simulator told to stop quiet machines after twice the services' default: the
    # comparison names what drifted.
    reaper = ReaperSettings.model_construct(idle_stop_after_s=2 * ReaperSettings().idle_stop_after_s)
    sim = _simulate(name, NetSettings(reaper=reaper)).history
    assert sim is not None
    drifted = differences(sim, services, tolerance_s=TICK_S)
    # Machines stopped later; a job that found its machine stopped and waited for a start
    # now finds it still ready.
    assert any(d.startswith("machine") and "STOPPING" in d for d in drifted), drifted
    assert any(d.startswith("job") for d in drifted), drifted
