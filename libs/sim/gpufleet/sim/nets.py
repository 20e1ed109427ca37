"""The simulator's side of the net registry: the settings its nets read, and their cadences.

A net's cadence, thresholds and back-offs have one home, its service's ``Settings``; the
simulator reads them from there, through the same bindings the services register their
Tickers with (``gpufleet.reaper.nets``, ``gpufleet.sweeper.nets``). Which nets it must
model is the registry's (:mod:`gpufleet.common.nets`); ``world.py`` checks its handlers
against it at import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpufleet.common import nets
from gpufleet.reaper import nets as reaper_nets
from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sweeper import nets as sweeper_nets
from gpufleet.sweeper.settings import Settings as SweeperSettings


def _reaper_defaults() -> ReaperSettings:
    # The defaults, not the shell's environment: a month reproduces wherever it is run.
    return ReaperSettings.model_construct()


def _sweeper_defaults() -> SweeperSettings:
    return SweeperSettings.model_construct()


def _scheduler_defaults() -> SchedulerSettings:
    return SchedulerSettings.model_construct()


@dataclass(frozen=True)
class NetSettings:
    """The services' settings a simulated month runs under (their defaults unless given):
    the nets' (reaper, sweeper), and the scheduler's for what the fleet tick and dispatch
    write that the nets then read (a machine's provision deadline, the dispatch deadline,
    the start back-off, when a worker counts as fresh)."""

    reaper: ReaperSettings = field(default_factory=_reaper_defaults)
    sweeper: SweeperSettings = field(default_factory=_sweeper_defaults)
    scheduler: SchedulerSettings = field(default_factory=_scheduler_defaults)

    def every(self, name: str) -> float:
        """The cadence of the registered net ``name``, in seconds, from its service's settings."""
        net = nets.BY_NAME[name]
        if net.service is nets.Service.REAPER:
            return reaper_nets.BY_NAME[name].every(self.reaper)
        return sweeper_nets.BY_NAME[name].every(self.sweeper)

    def cadences(self) -> dict[str, float]:
        """Every simulated net's cadence, in the registry's order."""
        return {net.name: self.every(net.name) for net in nets.simulated()}


# Every policy setting a simulated month reads, by service (a drift test records what the
# simulator reads and compares): what ``gpufleet simulate --sweep`` may change. Addresses,
# credentials and the deployment's name are not policy; the simulator reads none of them
# but ``deployment_id`` (the orphan policy's, replaced by the simulated deployment's own).
READ_BY_SIMULATOR: dict[str, frozenset[str]] = {
    "reaper": frozenset(
        {
            "idle_scan_every_s",
            "auto_stop_every_s",
            "auto_destroy_every_s",
            "provision_deadline_every_s",
            "boot_failure_every_s",
            "went_silent_every_s",
            "lost_detector_every_s",
            "stuck_transition_every_s",
            "idle_stop_after_s",
            "idle_destroy_after_s",
            "idle_gpu_busy_percent",
            "idle_engine_busy_percent",
            "auto_stop_grace_s",
            "auto_destroy_grace_s",
            "provision_deadline_default_s",
            "boot_window_s",
            "went_silent_after_s",
            "went_silent_grace_s",
            "lost_after_s",
            "lost_still_there_within_s",
            "stuck_transition_after_s",
            "offering_quarantine_ttl_s",
            "halt_provisioning_ttl_s",
            "lost_retry_backoff_s",
            "disruption_budget",
            # Its leader lease: a paused leader's nets stop until it runs out.
            "lease_ttl_s",
        }
    ),
    "sweeper": frozenset(
        {
            "inventory_reconcile_every_s",
            "orphan_sweep_every_s",
            "orphan_grace_s",
            "not_listed_grace_s",
            # Its ledger rows' outcome policy (a loss's replacement).
            "offering_quarantine_ttl_s",
            "halt_provisioning_ttl_s",
            "lost_retry_backoff_s",
            "disruption_budget",
        }
    ),
    "scheduler": frozenset(
        {
            "worker_fresh_s",
            "attempt_lease_s",
            "provision_deadline_s",
            "start_backoff_s",
            "retry_backoff_s",
            "lost_retry_backoff_s",
            "disruption_budget",
            # Its ledger rows' outcome policy (a refused create's quarantine or halt).
            "offering_quarantine_ttl_s",
            "halt_provisioning_ttl_s",
            "fair_share_window_s",
            "fair_share_quantum_s",
            "film_share",
            "dispatch_deadline_s",
            "dispatch_backoff_s",
            "dispatch_backoff_max_s",
            "pool_idle_every_s",
            "queue_wait_every_s",
            "paid_wait_every_s",
            "paid_wait_after_s",
        }
    ),
}
SWEEPABLE: frozenset[str] = frozenset().union(*READ_BY_SIMULATOR.values())
_CLASSES: dict[str, type[ReaperSettings | SweeperSettings | SchedulerSettings]] = {
    "reaper": ReaperSettings,
    "sweeper": SweeperSettings,
    "scheduler": SchedulerSettings,
}


class SettingRefused(ValueError):
    """A setting a month cannot run with: one the simulator does not read, or a value its
    service's validation refuses or would change. The message names the field."""


def _validated(cls: type[Any], name: str | None, value: str | None) -> Any:
    # Every field given: what is given wins over the environment and a config file, so a
    # month reproduces wherever it is run; given, they are validated as a service's are.
    defaults = cls.model_construct()
    data = {f: getattr(defaults, f) for f in cls.model_fields}
    if name is not None:
        data[name] = value
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        why = "; ".join(_error(e) for e in exc.errors())
        raise SettingRefused(f"{name}={value}: {why}") from None


def _error(e: Any) -> str:
    loc = ".".join(str(p) for p in e["loc"])
    msg = str(e["msg"]).removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def validated(name: str, value: str) -> NetSettings:
    """The services' settings with ``name`` set to ``value`` wherever a service has it (as
    one ``GPUFLEET_*`` variable would set it for every process), each built and validated as
    its service builds it. Raises :class:`SettingRefused`, naming the field, for a setting
    the simulator does not read, a value refused, or a value the validation changes (went
    silent's hard floor raises a lower threshold with only a warning: two runs of a sweep
    would then run the same month under different labels)."""
    if name not in SWEEPABLE:
        raise SettingRefused(
            f"{name}: not a setting the simulator reads; choose from {', '.join(sorted(SWEEPABLE))}"
        )
    built: dict[str, Any] = {}
    for service, cls in _CLASSES.items():
        given = name in cls.model_fields
        s = built[service] = _validated(cls, name if given else None, value if given else None)
        if given and float(getattr(s, name)) != float(value):
            raise SettingRefused(
                f"{name}={value}: the {service}'s validation changes it to {getattr(s, name):g} "
                "(a hard floor or bound), so the month would not run with the value given"
            )
    return NetSettings(reaper=built["reaper"], sweeper=built["sweeper"], scheduler=built["scheduler"])
