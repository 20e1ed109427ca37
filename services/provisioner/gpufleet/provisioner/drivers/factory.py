"""Builds the configured drivers: a typed Provider -> Driver mapping, never string dispatch."""

from __future__ import annotations

from gpufleet.common.clock import Clock
from gpufleet.provisioner.drivers.base import Driver, Provider
from gpufleet.provisioner.drivers.instrumented import InstrumentedDriver
from gpufleet.provisioner.drivers.local import DEFAULT_AGENT_COMMAND, LocalDriver
from gpufleet.provisioner.drivers.sim import SimCloud, SimLatencies
from gpufleet.provisioner.settings import Settings


def local_driver(settings: Settings, clock: Clock) -> LocalDriver:
    return LocalDriver(
        settings.local_root,
        settings.deployment_id,
        clock,
        scheduler_address=settings.scheduler_address,
        agent_command=settings.local_agent_command or DEFAULT_AGENT_COMMAND,
        base_port=settings.local_agent_base_port,
        agent_wait_s=settings.local_agent_wait_s,
        stop_grace_s=settings.local_stop_grace_s,
        max_machines=settings.local_max_machines,
    )


def sim_driver(settings: Settings, clock: Clock) -> Driver:
    cloud = SimCloud(
        clock,
        SimLatencies(
            boot_s=settings.sim_boot_latency_s,
            start_s=settings.sim_start_latency_s,
            stop_s=settings.sim_stop_latency_s,
        ),
        max_instances=settings.sim_max_instances,
    )
    for zone in settings.sim_stockout_zones:
        cloud.set_stockout(zone)
    return cloud.driver(settings.deployment_id)


def build_drivers(settings: Settings, clock: Clock) -> dict[Provider, Driver]:
    """One instrumented driver per enabled provider.

    GCP and AWS are not built yet (a later issue adds them); enabling one fails at start,
    loudly, rather than serving a provisioner that cannot do what it was told.
    """
    builders = {Provider.LOCAL: local_driver, Provider.SIM: sim_driver}
    drivers: dict[Provider, Driver] = {}
    for provider in settings.drivers:
        build = builders.get(provider)
        if build is None:
            raise ValueError(f"driver {provider.value} is not available in this build")
        drivers[provider] = InstrumentedDriver(build(settings, clock))
    return drivers
