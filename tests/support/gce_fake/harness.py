"""A gcp driver wired to a running :class:`~tests.support.gce_fake.GceFake`, for tests.

Credentials are ``AnonymousCredentials``, passed in explicitly: the fake checks none, and
no test ever reaches for the SDK's default chain.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from google.auth.credentials import AnonymousCredentials

from gpufleet.common.clock import Clock, RealClock
from gpufleet.common.trust.pki import MachineIssuer
from gpufleet.provisioner.drivers.base import CapacityType, Offering, Provider
from gpufleet.provisioner.drivers.gcp import GcpClients, GcpDriver, GcpOptions
from gpufleet.provisioner.drivers.gcp_instances import Recipe
from tests.support.gce_fake.server import GceFake

TEST_IMAGE = "projects/gpufleet-images/global/images/family/gpufleet-l4"

GCP_OFFERING = Offering(
    provider=Provider.GCP,
    region="us-central1",
    zone="us-central1-a",
    instance_type="g2-standard-8",
    slots=2,
    gpu_model="L4",
)
GCP_SPOT_OFFERING = Offering(
    provider=Provider.GCP,
    region="europe-west4",
    zone="europe-west4-a",
    instance_type="g2-standard-4",
    slots=1,
    capacity_type=CapacityType.SPOT,
    gpu_model="L4",
)


def gcp_driver_for(
    fake: GceFake,
    deployment_id: str,
    *,
    clock: Clock | None = None,
    monotonic: Callable[[], float] = time.monotonic,
    machine_issuer: MachineIssuer | None = None,
    **options: Any,
) -> GcpDriver:
    """A driver on ``fake``; ``options`` override :class:`GcpOptions` fields. Reads are not
    retried (read_retry_s=0), so each scripted fault is seen exactly once."""
    settings: dict[str, Any] = {
        "operation_wait_s": 10.0,
        "operation_poll_s": 1.0,
        "request_timeout_s": 10.0,
        "read_retry_s": 0.0,
        **options,
    }
    recipe = settings.pop("recipe", Recipe(image=TEST_IMAGE, scheduler_address="10.0.0.2:50051"))
    return GcpDriver(
        GcpClients.connect(fake.endpoint, AnonymousCredentials()),
        deployment_id,
        clock or RealClock(),
        GcpOptions(project=fake.project, recipe=recipe, **settings),
        monotonic=monotonic,
        machine_issuer=machine_issuer,
    )
