"""The simulator's nets read their cadences, thresholds and back-offs from the services'
settings, and nowhere else.

Two checks: a month built with settings off their defaults runs with those values (a
setting the simulator read from a second place — a literal, a policy's dataclass default —
would keep the default); and world.py holds no number literal equal to a configured
cadence, threshold, deadline or back-off, outside the few places where such a number is
the simulated world's own truth, each named here with why.
"""

from __future__ import annotations

import ast
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sim import world
from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import PROFILES, Script, ScriptedJob, SimConfig
from gpufleet.sim.records import Job, Machine
from gpufleet.sim.report import limits
from gpufleet.sim.world import Sim
from gpufleet.sweeper.settings import Settings as SweeperSettings
from tests.support.sim_script import OFFERING

# Settings whose values are durations a net, the tick or dispatch is configured with.
_DURATION = ("_every_s", "_after_s", "_grace_s", "_window_s", "_deadline_s", "_backoff_s")
_DURATION += ("_wait_s", "_within_s", "_fresh_s", "_default_s", "_ttl_s", "_lease_s")

# (function, value): a number that is the simulated world's truth, not a setting.
_WORLD_TRUTHS = {
    # A machine's life as the profile draws it: the clock skew of a bad host (±10 min) and
    # the slowest agent start (15 min).
    ("_new_life", 600.0): "clock skew drawn",
    ("_new_life", 60.0): "the slowest agent start, 15 * 60 s",
    # The utilisation a busy GPU reads, percent.
    ("_net_idle_scanner", 90.0): "a busy GPU's utilisation",
    # The calendar (per month of 30 days) and how long a restart or pause lasts.
    ("_environment", 30.0): "days in the profile's month",
    ("_environment", 120.0): "an outage's longest draw",
}


def _configured() -> dict[float, list[str]]:
    values: dict[float, list[str]] = {}
    for cls in (ReaperSettings, SweeperSettings, SchedulerSettings):
        for name, field in cls.model_fields.items():
            default = field.default
            if not name.endswith(_DURATION) or isinstance(default, bool):
                continue
            # From the shortest cadence up to, not including, a day (the world's calendar).
            if isinstance(default, int | float) and 30 <= default < 86400:
                values.setdefault(float(default), []).append(f"{cls.__module__}.{name}")
    return values


def test_world_py_restates_no_cadence_threshold_or_back_off() -> None:
    configured = _configured()
    tree = ast.parse(Path(world.__file__).read_text())
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef):
            function = node.name
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int | float)
            and not isinstance(node.value, bool)
            and float(node.value) in configured
            and (function, float(node.value)) not in _WORLD_TRUTHS
        ):
            names = configured[float(node.value)]
            found.append(f"line {node.lineno} in {function}: {node.value} (= {names})")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    assert found == [], "read these from the services' settings (gpufleet.sim.nets):\n" + "\n".join(found)


def test_a_month_runs_on_the_settings_it_is_given_not_on_defaults() -> None:
    reaper = ReaperSettings.model_construct(
        idle_scan_every_s=20.0,
        went_silent_every_s=50.0,
        went_silent_after_s=1500.0,
        went_silent_grace_s=700.0,
        idle_stop_after_s=400.0,
        boot_window_s=2400.0,
        lost_after_s=200.0,
        stuck_transition_after_s=700.0,
        offering_quarantine_ttl_s=900.0,
        lost_retry_backoff_s=45.0,
    )
    sweeper = SweeperSettings.model_construct(
        inventory_reconcile_every_s=90.0, orphan_grace_s=2400.0, lost_retry_backoff_s=35.0
    )
    scheduler = SchedulerSettings.model_construct(
        provision_deadline_s=1500.0,
        worker_fresh_s=75.0,
        dispatch_deadline_s=40.0,
        start_backoff_s=70.0,
        retry_backoff_s=15.0,
        lost_retry_backoff_s=50.0,
    )
    settings = NetSettings(reaper=reaper, sweeper=sweeper, scheduler=scheduler)
    sim = Sim(SimConfig(days=0.05, machines=10, seed=3, faults=PROFILES["harsh"]), settings=settings)
    assert sim.every["idle_scanner"] == 20.0
    assert sim.every["went_silent"] == 50.0
    assert sim.every["inventory_reconcile"] == 90.0
    assert sim.silent_policy.silent_after == timedelta(seconds=1500)
    assert sim.silent_policy.grace == timedelta(seconds=700)
    assert sim.idle_policy.stop_after == timedelta(seconds=400)
    assert sim.boot_policy.window == timedelta(seconds=2400)
    assert sim.lost_after_s == 200.0
    assert sim.stuck_after_s == 700.0
    assert sim.orphan_policy.grace == timedelta(seconds=2400)
    assert sim.orphan_policy.deployment_id == world.DEPLOYMENT
    # Each service's ledger rows take effect under its own outcome policy.
    assert sim.outcomes["reaper"].offering_quarantine_ttl == timedelta(seconds=900)
    assert sim.outcomes["scheduler"].offering_quarantine_ttl == timedelta(seconds=1800)  # its default
    assert [sim.outcomes[s].lost_retry_backoff_s for s in ("reaper", "sweeper", "scheduler")] == [
        45.0,
        35.0,
        50.0,
    ]
    assert sim.tick_policy.worker_fresh_s == 75.0
    assert (sim.retries.retry_backoff_s, sim.retries.lost_retry_backoff_s) == (15.0, 50.0)
    # The report judges detections against the same settings.
    judged = limits(sim)
    assert judged["worker_wedges"] == (1500.0 + sim.heartbeat_s, 50.0)
    assert judged["path_drop"] == (20.0 + 200.0, sim.every["lost_detector"])
    assert judged["provision_stall"] == (1500.0, sim.every["provision_deadline"])
    assert judged["call_failed"] == (700.0, sim.every["stuck_transition"])
    sim.run()
    # What the rows were written with: each machine's provision deadline is the
    # scheduler's, counted from its request.
    assert sim.machines
    for m in sim.machines.values():
        assert m.requested_at is not None and m.provision_deadline_at is not None
        assert m.provision_deadline_at - m.requested_at == timedelta(seconds=1500)


class Preempted(Sim):
    """The first machine's instance is taken back 20 minutes after it runs, its job live."""

    def _scripted_life(self, m: Machine, boot_at: float) -> None:
        if m.ordinal == 1 and m.life == 1:
            life = m.life
            self.q.at(boot_at + 1200.0, lambda: self._preempt(m, life))
        super()._scripted_life(m, boot_at)


def test_a_loss_the_sweeper_records_requeues_with_the_sweepers_back_off() -> None:
    """The replacement's requeue back-off is the writing service's outcome policy's (the
    sweeper's here), not the scheduler's, as ``end_live_attempts_lost`` builds it."""
    spot = replace(OFFERING, id="sim-l4-spot", capacity_type="SPOT")
    script = Script(
        offering=spot, workspaces=(("ws", "creator"),), jobs=(ScriptedJob(10.0, "ws", "clip", 3000.0),)
    )
    settings = NetSettings(
        sweeper=SweeperSettings.model_construct(lost_retry_backoff_s=35.0),
        scheduler=SchedulerSettings.model_construct(lost_retry_backoff_s=50.0),
    )
    requeued: list[float] = []

    class Watching(Preempted):
        def _requeue(self, job: Job, not_before: float) -> None:
            requeued.append(not_before - self.q.now)
            super()._requeue(job, not_before)

    sim = Watching(SimConfig(days=2 / 24, machines=2, tick_s=10.0, script=script), settings=settings)
    sim.run()
    assert sim.metrics.attempt_ends["reclaimed"] == 1
    assert requeued == [35.0]
