"""Driver harnesses for the one contract suite, and helpers for local machines.

The contract suite runs the local driver with the real agent (``python -m gpufleet.agent``);
tests of what the agent cannot be made to do on purpose (a hung boot, ignoring SIGTERM) use
fake_agent.py. Adding a driver to the contract suite is one fixture: write ``<name>_harness`` returning a
:class:`DriverHarness` and add ``<name>`` to :data:`CONTRACT_DRIVERS` (and to
:data:`SCRIPTABLE_DRIVERS` when its backend can be told to fail the next call).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.common import host_release
from gpufleet.common.clock import ManualClock
from gpufleet.common.provider_errors import ProviderError
from gpufleet.provisioner.drivers import local_procs
from gpufleet.provisioner.drivers.base import Driver, Offering, Provider
from gpufleet.provisioner.drivers.local import DEFAULT_AGENT_COMMAND, LocalDriver
from gpufleet.provisioner.drivers.sim import SimCloud, SimLatencies, SimOp
from tests.support import tls
from tests.support.moto_server import (
    TEST_REGIONS,
    Ec2Faults,
    MotoServer,
    aws_driver_for,
    fault_for,
    start_moto_server,
)

CONTRACT_DRIVERS = ["sim", "local", "aws", "gcp"]
SCRIPTABLE_DRIVERS = ["sim", "aws"]

FAKE_AGENT = Path(__file__).with_name("fake_agent.py")


@dataclass
class DriverHarness:
    """One driver under test, and the knobs its backend offers."""

    # A driver of the given deployment on the same backend (same account, same host).
    make_driver: Callable[[str], Driver]
    offering: Offering
    # Let provider-side time pass once (advance a manual clock, or a short real pause).
    step: Callable[[], None]
    # Make the offering's zone (or host) refuse new instances for lack of capacity.
    exhaust_capacity: Callable[[], None]
    # Make the next call of an operation fail with the error (scriptable backends only).
    inject: Callable[[SimOp, ProviderError], None] | None = None


def local_driver(root: Path, deployment_id: str, *, agent: str = "real", **kwargs: object) -> LocalDriver:
    """A local driver on ``root``. ``agent="real"`` runs ``python -m gpufleet.agent``; the
    other values run fake_agent.py in that mode (``serve``, ``hang``, ``ignore-term``)."""
    options: dict[str, object] = {
        "scheduler_address": "127.0.0.1:1",
        "agent_wait_s": 30.0,
        "stop_grace_s": 3.0,
        "machine_issuer": tls.machine_issuer(deployment_id),
        **kwargs,
    }
    command = DEFAULT_AGENT_COMMAND if agent == "real" else (sys.executable, str(FAKE_AGENT), agent)
    return LocalDriver(root, deployment_id, ManualClock(), agent_command=command, **options)  # type: ignore[arg-type]


def agent_env(root: Path, machine_id: str) -> dict[str, str]:
    """The environment the machine's agent process really runs with."""
    pid = int((root / machine_id / "disk" / "agent.pid").read_text())
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def kill_local_machines(root: Path) -> None:
    """Teardown safety net: end every process group recorded under ``root`` and give back
    the slot users and walls its machines took on this host."""
    if root.is_dir():
        for record in root.glob("*/instance.json"):
            with contextlib.suppress(ValueError, OSError):
                pgid = json.loads(record.read_text()).get("pgid")
                if pgid:
                    local_procs.end_group(int(pgid), 1.0, lambda: None)
    assert host_release.release_stack(root) == []


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def sim_harness() -> DriverHarness:
    clock = ManualClock()
    cloud = SimCloud(clock, SimLatencies(boot_s=45, start_s=30, stop_s=20))
    offering = Offering(
        provider=Provider.SIM,
        region="sim-1",
        zone="sim-1a",
        instance_type="g2-standard-8",
        slots=2,
        gpu_model="L4",
    )
    return DriverHarness(
        make_driver=cloud.driver,
        offering=offering,
        step=lambda: clock.advance(15),
        exhaust_capacity=lambda: cloud.set_stockout("sim-1a"),
        inject=cloud.fail_next,
    )


@pytest.fixture
def local_harness(tmp_path: Path) -> Iterator[DriverHarness]:
    root = tmp_path / "machines"
    drivers: list[LocalDriver] = []
    pause = threading.Event()

    def make(deployment_id: str) -> Driver:
        driver = local_driver(root, deployment_id, max_machines=drivers[0].max_machines if drivers else 0)
        drivers.append(driver)
        return driver

    def exhaust() -> None:
        # The host is full at what runs now (the suite creates a machine before this).
        for driver in drivers:
            driver.max_machines = sum(1 for p in root.iterdir() if p.is_dir())

    offering = Offering(
        provider=Provider.LOCAL,
        region="local",
        zone="local-a",
        instance_type="local-g2-standard-8",
        slots=2,
        gpu_model="L4",
    )
    yield DriverHarness(
        make_driver=make, offering=offering, step=lambda: pause.wait(0.05), exhaust_capacity=exhaust
    )
    kill_local_machines(root)


@pytest.fixture(scope="session")
def moto_server() -> Iterator[MotoServer]:
    server = start_moto_server()
    yield server
    server.stop()


@pytest.fixture
def aws_faults(moto_server: MotoServer) -> Ec2Faults:
    """No live instance of an earlier test in moto, and a fresh fault script."""
    moto_server.clear(TEST_REGIONS)
    return Ec2Faults()


@pytest.fixture
def aws_harness(moto_server: MotoServer, aws_faults: Ec2Faults) -> DriverHarness:
    """EC2 on moto's server; injected errors arrive as EC2 error answers on the next call."""
    offering = Offering(
        provider=Provider.AWS,
        region="us-east-1",
        zone="us-east-1a",
        instance_type="g6.xlarge",
        slots=1,
        gpu_model="L4",
    )
    return DriverHarness(
        make_driver=lambda deployment_id: aws_driver_for(moto_server, aws_faults, deployment_id),
        offering=offering,
        step=lambda: None,  # moto settles every transition by the next describe
        exhaust_capacity=lambda: aws_faults.stockout("us-east-1a"),
        inject=lambda _op, error: aws_faults.fail_next(fault_for(error)),
    )


@pytest.fixture
def gcp_harness() -> Iterator[DriverHarness]:
    """Compute Engine on the project's REST fake (tests/support/gce_fake) in real time:
    operations take tens of milliseconds, a stockout is the zone's operation error. Not in
    SCRIPTABLE_DRIVERS: GCE cannot say "not yet done" to a get or a list, and a destroy
    that finds nothing answers False rather than not-found; test_gcp_driver.py covers every
    error class on every call where GCE can raise it."""
    from tests.support.gce_fake import GceFake, Latencies
    from tests.support.gce_fake.harness import GCP_OFFERING, gcp_driver_for

    pause = threading.Event()
    with GceFake(latencies=Latencies(insert=0.05, start=0.05, stop=0.05, delete=0.05)) as fake:
        yield DriverHarness(
            make_driver=lambda deployment_id: gcp_driver_for(fake, deployment_id),
            offering=GCP_OFFERING,
            step=lambda: pause.wait(0.05),
            exhaust_capacity=lambda: fake.set_stockout(GCP_OFFERING.zone),
        )


@pytest.fixture(params=CONTRACT_DRIVERS)
def harness(request: pytest.FixtureRequest) -> DriverHarness:
    return request.getfixturevalue(f"{request.param}_harness")  # type: ignore[no-any-return]


@pytest.fixture(params=SCRIPTABLE_DRIVERS)
def scriptable_harness(request: pytest.FixtureRequest) -> DriverHarness:
    return request.getfixturevalue(f"{request.param}_harness")  # type: ignore[no-any-return]
