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
        machine_issuer=settings.machine_issuer(),
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


def aws_driver(settings: Settings, clock: Clock) -> Driver:
    """EC2 in every region of GPUFLEET_AWS_REGIONS, each with its image; credentials from
    boto3's standard chain. A region without an image fails at start, not at first create."""
    # Imported here: only a provisioner that runs the aws driver loads boto3.
    from gpufleet.provisioner.drivers.aws import AwsDriver, AwsOptions
    from gpufleet.provisioner.drivers.aws_clients import ClientBounds, Ec2Clients

    if not settings.aws_regions:
        raise ValueError("driver AWS needs GPUFLEET_AWS_REGIONS")
    missing = [r for r in settings.aws_regions if not settings.aws_images.get(r)]
    if missing:
        raise ValueError(f"driver AWS has no image for region(s) {', '.join(missing)} (GPUFLEET_AWS_IMAGES)")
    options = AwsOptions(
        regions=tuple(settings.aws_regions),
        images=dict(settings.aws_images),
        subnets=dict(settings.aws_subnets),
        security_groups={r: tuple(g) for r, g in settings.aws_security_groups.items()},
        agent_port=settings.aws_agent_port,
        page_size=settings.aws_page_size,
    )
    clients = Ec2Clients(
        endpoint_url=settings.aws_endpoint_url,
        bounds=ClientBounds(
            connect_timeout_s=settings.aws_connect_timeout_s,
            read_timeout_s=settings.aws_read_timeout_s,
            max_attempts=settings.aws_max_attempts,
        ),
    )
    return AwsDriver(settings.deployment_id, options, clients, machine_issuer=settings.machine_issuer())


def gcp_driver(settings: Settings, clock: Clock) -> Driver:
    """Compute Engine in GPUFLEET_GCP_PROJECT; credentials from the SDK's standard chain
    (application default credentials). Anonymous calls are for an emulator only, so they
    need GPUFLEET_GCP_API_ENDPOINT too. A missing project, image or credential fails at start."""
    # Imported here: only a provisioner that runs the gcp driver loads google-cloud-compute.
    from google.auth import exceptions as auth_exceptions
    from google.auth.credentials import AnonymousCredentials

    from gpufleet.provisioner.drivers.gcp import GcpClients, GcpDriver, GcpOptions
    from gpufleet.provisioner.drivers.gcp_instances import Recipe

    options = GcpOptions(
        project=settings.gcp_project,
        recipe=Recipe(
            image=settings.gcp_image,
            boot_disk_gb=settings.gcp_boot_disk_gb,
            boot_disk_type=settings.gcp_boot_disk_type,
            network=settings.gcp_network,
            subnetwork=settings.gcp_subnetwork,
            external_ip=settings.gcp_external_ip,
            agent_port=settings.gcp_agent_port,
            scheduler_address=settings.scheduler_address,
        ),
        zones=tuple(settings.gcp_zones),
        operation_wait_s=settings.gcp_operation_wait_s,
        operation_poll_s=settings.gcp_operation_poll_s,
        request_timeout_s=settings.gcp_request_timeout_s,
        read_retry_s=settings.gcp_read_retry_s,
        page_size=settings.gcp_page_size,
        request_id_window_s=settings.gcp_request_id_window_s,
    )
    credentials = None
    if settings.gcp_anonymous_credentials:
        if not settings.gcp_api_endpoint:
            raise ValueError(
                "GPUFLEET_GCP_ANONYMOUS_CREDENTIALS is for an emulator: set GPUFLEET_GCP_API_ENDPOINT"
            )
        credentials = AnonymousCredentials()
    try:
        clients = GcpClients.connect(settings.gcp_api_endpoint, credentials)
    except auth_exceptions.DefaultCredentialsError as exc:
        raise ValueError(f"driver GCP found no application default credentials: {exc}") from exc
    return GcpDriver(
        clients, settings.deployment_id, clock, options, machine_issuer=settings.machine_issuer()
    )


def build_drivers(settings: Settings, clock: Clock) -> dict[Provider, Driver]:
    """One instrumented driver per enabled provider.

    A provider this build has no driver for fails at start,
    loudly, rather than serving a provisioner that cannot do what it was told.
    """
    builders = {
        Provider.LOCAL: local_driver,
        Provider.SIM: sim_driver,
        Provider.AWS: aws_driver,
        Provider.GCP: gcp_driver,
    }
    drivers: dict[Provider, Driver] = {}
    for provider in settings.drivers:
        build = builders.get(provider)
        if build is None:
            raise ValueError(f"driver {provider.value} is not available in this build")
        drivers[provider] = InstrumentedDriver(build(settings, clock))
    return drivers
