"""Fixtures of the cross-cloud scenarios: both clouds, and the control plane over them.

``world`` is parametrized over the cloud a scenario is about (``gcp`` or ``aws``); the
other cloud is always there too, as the place the scale step can go instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.clouds.clouds import AwsCloud, GcpCloud
from tests.integration.clouds.world import World, build_world
from tests.support.gce_fake import GceFake
from tests.support.moto_server import Ec2Faults, MotoServer, start_moto_server

CLOUDS = ["gcp", "aws"]


@pytest.fixture(scope="session")
def clouds_moto() -> Iterator[MotoServer]:
    server = start_moto_server()
    yield server
    server.stop()


@pytest.fixture
def gcp() -> Iterator[GcpCloud]:
    # Real time, operations finished as they are answered: nothing here waits.
    with GceFake() as fake:
        yield GcpCloud(fake)


@pytest.fixture
def aws(clouds_moto: MotoServer) -> AwsCloud:
    clouds_moto.clear((AwsCloud.region,))  # no live instance of an earlier test
    return AwsCloud(clouds_moto, Ec2Faults())


@pytest.fixture(params=CLOUDS)
def world(request: pytest.FixtureRequest, pg_url: str, gcp: GcpCloud, aws: AwsCloud) -> Iterator[World]:
    """The control plane over both clouds; ``world.cloud`` is the parametrized one."""
    cloud, other = (gcp, aws) if request.param == "gcp" else (aws, gcp)
    with build_world(pg_url, cloud, other) as built:
        yield built
