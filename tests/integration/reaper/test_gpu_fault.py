"""The GPU-fault net on the running plane: real PostgreSQL, the reaper's whole set of nets
under the real Ticker and leader lease, the scheduler's real WorkerService (whose
heartbeat stores the finding, cordons the machine and writes the gpu_fault row) and the
real ProvisionerService with its sim driver over gRPC.

A critical finding gets the machine destroyed (the instance gone at the provider, not
stopped); a warning leaves it alone; each refusal the net makes is on the ledger once,
and nothing is written or called by a replica that does not hold the lease."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import select, update

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.db.models import Attempt, Failure, Machine
from gpufleet.common.errors import Fenced
from gpufleet.common.leadership import LeaderLease
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.gpu_fault import GpuFault, GpuFaultPolicy
from gpufleet.v1 import machine_pb2, worker_service_pb2
from tests.integration.reaper.plane import Plane, running_plane
from tests.support import tls
from tests.support.fleet_rows import add_attempt

CRITICAL = machine_pb2.GPU_FINDING_SEVERITY_CRITICAL
WARNING = machine_pb2.GPU_FINDING_SEVERITY_WARNING
XID_79 = machine_pb2.GpuHealth(
    state=machine_pb2.GPU_HEALTH_STATE_CRITICAL,
    findings=[
        machine_pb2.GpuFinding(kind="xid", severity=CRITICAL, gpu_index=0, code=79, message="fell off")
    ],
)
XID_13 = machine_pb2.GpuHealth(
    state=machine_pb2.GPU_HEALTH_STATE_WARNING,
    findings=[machine_pb2.GpuFinding(kind="xid", severity=WARNING, gpu_index=0, code=13, message="graphics")],
)
STORED_XID_79 = [{"kind": "xid", "severity": "critical", "gpu_index": 0, "code": 79, "message": "m"}]


@pytest.fixture
def plane(pg_url: str) -> Iterator[Plane]:
    with running_plane(pg_url, gpu_fault_slot_wait_s=120.0) as plane:
        yield plane


def heartbeat(
    plane: Plane, machine_id: str, health: machine_pb2.GpuHealth, running: list[str] | None = None
) -> worker_service_pb2.ReportHeartbeatResponse:
    """The machine's worker, as the agent's reporter sends it: its GPU health every time."""
    return plane.worker_stub.ReportHeartbeat(  # type: ignore[no-any-return]
        worker_service_pb2.ReportHeartbeatRequest(
            machine_id=machine_id,
            running=[worker_service_pb2.RunningAttempt(attempt_id=a, slot=0) for a in running or []],
            gpu_health=health,
        ),
        timeout=10,
    )


def provisioner(plane: Plane) -> ProvisionerClient:
    """The reaper's client of the plane's sim provisioner, for a net built by the test."""
    client = ProvisionerClient(plane.sim.address, tls.transport("reaper"), timeout_s=5.0)
    plane.stack.callback(client.close)
    return client


def details(plane: Plane, machine_id: str, failure_class: str) -> list[str]:
    with plane.sessions() as s:
        return [
            d or ""
            for d in s.execute(
                select(Failure.details)
                .where(Failure.machine_id == machine_id, Failure.failure_class == failure_class)
                .order_by(Failure.id)
            ).scalars()
        ]


def test_a_critical_finding_in_a_heartbeat_gets_the_machine_destroyed(plane: Plane) -> None:
    mid = plane.machine()
    plane.agents[mid].busy(gpu=90.0, running=1)
    attempt_id = add_attempt(plane.sessions, plane.clock.now(), mid)

    answer = heartbeat(plane, mid, XID_79, running=[attempt_id])
    assert list(answer.cancel_attempt_ids) == [attempt_id]  # the scheduler ended it: our failure
    # Its process still ran at that heartbeat: the fault's end holds its slot, and the
    # runner's stop (checkpoint, logs) is waited for.
    plane.tick()
    assert plane.row(mid).state == "READY"
    assert plane.refused(mid) == {"gpu_fault": {"SLOT_HELD"}}
    assert plane.provider_ops(mid) == []

    heartbeat(plane, mid, XID_79)  # the process is gone: the slot is free
    plane.step(60)

    row = plane.row(mid)
    assert (row.state, row.intent, row.cordoned) == ("DESTROYED", "DESTROYED", True)
    assert row.state_reason is not None and row.state_reason.startswith("destroy done; gpu_fault:")
    assert plane.instance_status(mid) is None  # gone at the provider, not stopped
    assert plane.provider_ops(mid) == ["destroy"]
    assert plane.ledger(mid) == [
        ("gpu_fault", "gpu_health", "REPLACE_MACHINE"),
        ("gpu_fault_destroy_refused", "gpu_fault", "NOTHING"),
        ("gpu_fault_destroyed", "gpu_fault", "NOTHING"),
    ]
    [destroyed] = details(plane, mid, "gpu_fault_destroyed")
    assert "xid 79 on GPU 0" in destroyed and "destroyed, not stopped" in destroyed
    assert plane.acted(mid) == {"gpu_fault": {"destroy"}}
    plane.step(60)  # the call's answer is counted in the net's next pass (ListWatchdogs)
    assert plane.stats("gpu_fault").actions == {"destroy": 1}


def held_slot(plane: Plane, machine_id: str) -> str:
    """An attempt the control plane ended while its process may still run on the machine
    (a cancel, a time limit, a take-back): ended, its slot held until the machine says so."""
    attempt_id = add_attempt(plane.sessions, plane.clock.now(), machine_id, state="CANCELLED")
    with plane.sessions() as s, s.begin():
        s.execute(
            update(Attempt)
            .where(Attempt.id == attempt_id)
            .values(holds_slot=True, ended_at=plane.clock.now())
        )
    return attempt_id


def test_an_ended_attempt_holding_its_slot_is_waited_for_until_the_machine_lets_go(plane: Plane) -> None:
    mid = plane.machine()
    plane.agents[mid].busy(gpu=90.0, running=1)
    attempt_id = held_slot(plane, mid)
    heartbeat(plane, mid, XID_79, running=[attempt_id])  # its process still runs there

    plane.tick()
    plane.step(60)
    assert plane.row(mid).state == "READY"
    assert plane.refused(mid) == {"gpu_fault": {"SLOT_HELD"}}
    assert plane.provider_ops(mid) == []

    # The next heartbeat no longer names it: the slot is free, and the machine goes.
    heartbeat(plane, mid, XID_79)
    plane.step(60)
    assert plane.row(mid).state == "DESTROYED"
    assert plane.provider_ops(mid) == ["destroy"]
    # Two passes refused for the same reason: one row.
    assert plane.ledger(mid) == [
        ("gpu_fault", "gpu_health", "REPLACE_MACHINE"),
        ("gpu_fault_destroy_refused", "gpu_fault", "NOTHING"),
        ("gpu_fault_destroyed", "gpu_fault", "NOTHING"),
    ]
    [refused] = details(plane, mid, "gpu_fault_destroy_refused")
    assert refused.startswith("SLOT_HELD: 1 ended attempt(s) still hold a slot")


def test_a_slot_never_let_go_is_destroyed_after_the_wait(plane: Plane) -> None:
    """A process wedged on a GPU that fell off the bus never exits: the destroy stops it."""
    mid = plane.machine()
    plane.agents[mid].busy(gpu=90.0, running=1)
    attempt_id = held_slot(plane, mid)
    heartbeat(plane, mid, XID_79, running=[attempt_id])

    plane.tick()
    plane.step(60)
    assert plane.row(mid).state == "READY"
    heartbeat(plane, mid, XID_79, running=[attempt_id])
    plane.step(60)  # 120 s since the fault: the wait is over
    assert plane.row(mid).state == "DESTROYED"
    assert plane.instance_status(mid) is None
    assert [c for c, _, _ in plane.ledger(mid)] == [
        "gpu_fault",
        "gpu_fault_destroy_refused",
        "gpu_fault_destroyed",
    ]
    [destroyed] = details(plane, mid, "gpu_fault_destroyed")
    assert "1 ended attempt(s) still held a slot after 120s" in destroyed


def test_a_warning_leaves_the_machine_alone(plane: Plane) -> None:
    mid = plane.machine()
    plane.agents[mid].busy(gpu=90.0, running=1)
    heartbeat(plane, mid, XID_13)
    plane.tick()
    for _ in range(5):
        heartbeat(plane, mid, XID_13)
        plane.step(60)
    row = plane.row(mid)
    assert (row.state, row.cordoned, row.gpu_health) == ("READY", False, "warning")
    assert plane.provider_ops(mid) == []
    assert plane.ledger(mid) == []
    assert "gpu_fault" not in plane.acted(mid) and "gpu_fault" not in plane.refused(mid)


def test_a_registered_box_is_refused_and_the_ledger_says_so_once(plane: Plane) -> None:
    mid = plane.machine(origin="REGISTERED", instance=False)
    plane.agents[mid].busy(gpu=90.0, running=1)
    heartbeat(plane, mid, XID_79)
    plane.tick()
    for _ in range(3):
        heartbeat(plane, mid, XID_79)
        plane.step(60)
    row = plane.row(mid)
    assert (row.state, row.cordoned) == ("READY", True)  # cordoned, for a human to repair
    assert plane.refused(mid)["gpu_fault"] == {"NOT_OURS"}
    assert plane.provider_ops(mid) == []
    assert plane.ledger(mid) == [
        ("gpu_fault", "gpu_health", "REPLACE_MACHINE"),
        ("gpu_fault_destroy_refused", "gpu_fault", "NOTHING"),
    ]
    [refused] = details(plane, mid, "gpu_fault_destroy_refused")
    assert refused.startswith("NOT_OURS: not provisioned and managed by this platform")


def test_a_live_attempt_pins_it_until_it_ends(plane: Plane) -> None:
    """A dispatch that raced the cordon: the attempt is live, so the ladder's work gate holds."""
    mid = plane.machine(cordoned=True, gpu_health="critical", gpu_findings=STORED_XID_79)
    plane.agents[mid].busy(gpu=90.0, running=1)
    attempt_id = add_attempt(plane.sessions, plane.clock.now(), mid)
    plane.tick()
    plane.step(60)
    assert plane.row(mid).state == "READY"
    assert plane.refused(mid)["gpu_fault"] == {"WORK_PINNED"}
    assert details(plane, mid, "gpu_fault_destroy_refused")[0].startswith("WORK_PINNED: 1 live attempt(s)")

    with plane.sessions() as s, s.begin():
        s.execute(update(Attempt).where(Attempt.id == attempt_id).values(state="SUCCEEDED"))
    plane.step(60)
    assert plane.row(mid).state == "DESTROYED"
    assert plane.provider_ops(mid) == ["destroy"]


def test_a_stopped_faulted_machine_is_destroyed_not_kept_as_warm_capacity(plane: Plane) -> None:
    mid = plane.machine(state="STOPPED", intent="STOPPED", gpu_health="critical", gpu_findings=STORED_XID_79)
    plane.provider_stops(mid)
    plane.tick()
    assert plane.row(mid).state == "DESTROYED"
    assert plane.instance_status(mid) is None
    assert plane.provider_ops(mid) == ["destroy"]


def test_a_row_that_changed_since_the_scan_is_refused_on_the_ledger(plane: Plane) -> None:
    mid = plane.machine(cordoned=True, gpu_health="critical", gpu_findings=STORED_XID_79)
    plane.lease.try_acquire()
    net = GpuFault(plane.sessions, plane.lease, plane.clock, provisioner(plane), GpuFaultPolicy())
    scanned = net.scan(plane.clock.now())
    assert [f.machine.machine_id for f in scanned] == [mid]
    # Another net claimed it between the scan and the claim.
    with plane.sessions() as s, s.begin():
        s.execute(update(Machine).where(Machine.id == mid).values(state="STOPPING"))
    decisions = DecisionLog("gpu_fault")
    net.act(plane.clock.now(), scanned, decisions)
    assert dict(decisions.report.refusals) == {"CHANGED_SINCE_SCAN": 1}
    assert plane.row(mid).state == "STOPPING"
    assert plane.provider_ops(mid) == []
    assert plane.ledger(mid) == [("gpu_fault_destroy_refused", "gpu_fault", "NOTHING")]


def test_a_replica_without_the_lease_writes_and_calls_nothing(plane: Plane) -> None:
    mid = plane.machine(cordoned=True, gpu_health="critical", gpu_findings=STORED_XID_79)
    plane.lease.try_acquire()  # the plane's reaper leads
    other = LeaderLease("reaper", "another-replica", plane.clock, plane.sessions, ttl_s=30.0)
    assert not other.try_acquire()
    net = GpuFault(plane.sessions, other, plane.clock, provisioner(plane), GpuFaultPolicy())
    with pytest.raises(Fenced):
        net.run(plane.clock.now())
    assert plane.row(mid).state == "READY"
    assert plane.provider_ops(mid) == []
    assert plane.ledger(mid) == []
