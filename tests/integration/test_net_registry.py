"""The net registry against what runs: the reaper and the sweeper as their ``main.build``
wires them (Tickers built on PostgreSQL, never started) and the simulator's month.

A net that one side runs and the other does not fails here: added to a service and not
to the registry, to the registry and not to the simulator (unless the registry says why
the simulator cannot model it), or given a cadence the simulator does not read.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import select

from gpufleet.common import nets
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import WatchdogStat
from gpufleet.reaper import main as reaper_main
from gpufleet.reaper.nets import REAPER_NETS
from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import PROFILES, SimConfig
from gpufleet.sim.world import MERGED_CHECK, NET_HANDLERS, Sim
from gpufleet.sweeper import main as sweeper_main
from gpufleet.sweeper.nets import SWEEPER_NETS
from gpufleet.sweeper.settings import Settings as SweeperSettings
from tests.support import tls

T0 = datetime(2026, 3, 1, tzinfo=UTC)


class _NeverCalled:
    """The provider, sampler and prober of a reaper whose loops never start."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} called on a reaper that was never started")


def _registered(pg_url: str, service: str) -> dict[str, float]:
    engine = make_engine(pg_url)
    try:
        with make_sessionmaker(engine)() as session:
            rows = session.execute(select(WatchdogStat).where(WatchdogStat.service == service)).scalars()
            return {row.name: row.cadence_s for row in rows}
    finally:
        engine.dispose()


def test_the_reaper_registers_the_registrys_nets_at_their_settings_cadences(pg_url: str) -> None:
    # Cadences off their defaults: each must come from its own setting.
    settings = ReaperSettings(
        database_url=pg_url,
        listen_address="127.0.0.1:0",
        instance_name="reaper-1",
        auto_stop_every_s=31.0,
        went_silent_every_s=61.0,
        gpu_fault_every_s=62.0,
        **tls.settings("reaper"),
    )
    never: Any = _NeverCalled()
    reaper = reaper_main.build(settings, clock=ManualClock(T0), provider=never, sampler=never, prober=never)
    try:
        tasks = reaper.ticker.tasks
        assert [t.name for t in tasks] == [n.name for n in nets.of(nets.Service.REAPER)]
        # Each task runs the pass of its own name (not another net's loop under its name).
        assert all(cast(Any, t.run).__self__.name == t.name for t in tasks)
        cadences = {t.name: t.cadence_s for t in tasks}
        assert cadences["auto_stop"] == 31.0
        assert cadences["went_silent"] == 61.0
        assert cadences["gpu_fault"] == 62.0
        assert cadences == {n.name: n.every(settings) for n in REAPER_NETS}
        # What the Ticker registered at start, where ListWatchdogs reads it.
        assert _registered(pg_url, "reaper") == cadences
    finally:
        reaper.close(0)


def test_the_sweeper_registers_the_registrys_passes_at_their_settings_cadences(pg_url: str) -> None:
    settings = SweeperSettings(
        database_url=pg_url,
        listen_address="127.0.0.1:0",
        instance_name="sweeper-1",
        orphan_sweep_every_s=301.0,
        **tls.settings("sweeper"),
    )
    never: Any = _NeverCalled()
    sweeper = sweeper_main.build(settings, clock=ManualClock(T0), provider=never)
    try:
        tasks = sweeper.ticker.tasks
        assert [t.name for t in tasks] == [n.name for n in nets.of(nets.Service.SWEEPER)]
        cadences = {t.name: t.cadence_s for t in tasks}
        assert cadences == {"inventory_reconcile": 60.0, "orphan_sweep": 301.0}
        assert cadences == {n.name: n.every(settings) for n in SWEEPER_NETS}
        assert _registered(pg_url, "sweeper") == cadences
    finally:
        sweeper.close(0)


def test_every_net_the_services_run_is_simulated_unless_the_registry_says_why_not() -> None:
    services = [n.name for n in REAPER_NETS] + [n.name for n in SWEEPER_NETS]
    assert services == [n.name for n in nets.NETS]
    modelled = set(NET_HANDLERS) - {MERGED_CHECK}
    for net in nets.NETS:
        if net.name in modelled:
            assert net.simulated, f"{net.name}: modelled, yet the registry says it is not"
        else:
            assert net.not_simulated.strip(), f"{net.name} runs in the {net.service} and not in the simulator"
    # Today, one: the simulator's machines have no GPU findings to read.
    assert {n.name for n in nets.NETS if not n.simulated} == {"gpu_fault"}


def test_the_simulated_month_runs_each_registered_net_at_its_settings_cadence() -> None:
    settings = NetSettings(
        reaper=ReaperSettings.model_construct(auto_stop_every_s=45.0, lost_detector_every_s=90.0),
        sweeper=SweeperSettings.model_construct(orphan_sweep_every_s=600.0),
    )
    sim = Sim(SimConfig(days=0.25, machines=20, seed=7, faults=PROFILES["harsh"]), settings=settings)
    sim.run()
    # No restart in a quarter of a day of this seed: every pass ran.
    assert sim.outages == []
    assert sim.scheduled_nets() == [n.name for n in nets.simulated()]
    assert set(sim.net_passes) == {n.name for n in nets.simulated()}
    for net in nets.simulated():
        every = settings.every(net.name)
        assert sim.net_passes[net.name] == int(sim.end // every), net.name
    assert sim.net_passes["auto_stop"] == int(sim.end // 45.0)
    assert sim.net_passes["orphan_sweep"] == int(sim.end // 600.0)


def test_the_merged_policy_swaps_its_one_check_in_for_the_nets_it_replaces() -> None:
    sim = Sim(SimConfig(days=0.1, machines=10, seed=7, faults=PROFILES["harsh"]), "merged")
    sim.run()
    names = [n.name for n in nets.simulated()]
    replaced = {"provision_deadline", "boot_failure", "went_silent", "lost_detector"}
    assert sim.scheduled_nets() == [n for n in names if n not in replaced] + [MERGED_CHECK]
    assert set(sim.net_passes) == set(sim.scheduled_nets())
