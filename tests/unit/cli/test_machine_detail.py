"""`gpufleet machines ID`: one machine's detail view says who changed its state last, and why;
the list and the detail show its GPUs' health."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.cli.machines import health, machine_detail, machines_table
from gpufleet.v1 import machine_pb2

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(when: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(when)
    return out


def lines(m: machine_pb2.Machine) -> list[str]:
    # The values are aligned; compare each line with its spacing collapsed.
    return [" ".join(line.split()) for line in machine_detail(m, NOW).splitlines()]


def test_the_detail_names_the_actor_and_the_reason() -> None:
    m = machine_pb2.Machine(
        machine_id="0b7c1e2a-0000-4000-8000-000000000001",
        pool="l4",
        offering=machine_pb2.Offering(offering_id="gcp-l4-spot"),
        state=machine_pb2.MACHINE_STATE_DESTROYING,
        intent=machine_pb2.MACHINE_INTENT_DESTROYED,
        state_changed_at=at(NOW - timedelta(minutes=3)),
        state_changed_by="reaper",
        state_reason="went_silent: no report for 10m",
        slots_total=2,
    )
    shown = lines(m)
    assert "state DESTROYING, intent DESTROYED" in shown
    assert "changed 3m ago by reaper: went_silent: no report for 10m" in shown


def test_a_row_from_before_the_actor_was_recorded_says_so() -> None:
    m = machine_pb2.Machine(machine_id="m", state=machine_pb2.MACHINE_STATE_READY)
    assert "changed - by ?" in lines(m)


def test_gpu_health_shows_in_the_list_and_the_detail() -> None:
    m = machine_pb2.Machine(
        machine_id="0b7c1e2a-0000-4000-8000-000000000001",
        state=machine_pb2.MACHINE_STATE_READY,
        cordoned=True,
        gpu_health=machine_pb2.GpuHealth(
            state=machine_pb2.GPU_HEALTH_STATE_CRITICAL,
            findings=[
                machine_pb2.GpuFinding(
                    kind="xid",
                    severity=machine_pb2.GPU_FINDING_SEVERITY_CRITICAL,
                    gpu_index=0,
                    code=79,
                    message="Xid 79 on GPU 0",
                )
            ],
            read_time=at(NOW - timedelta(seconds=20)),
        ),
    )
    assert health(m) == "critical:xid79"
    assert "HEALTH" in machines_table([m], NOW).splitlines()[0]
    assert "critical:xid79" in machines_table([m], NOW)
    assert "gpu health critical, read 20s ago — critical xid 79 on GPU 0: Xid 79 on GPU 0" in lines(m)
    assert health(machine_pb2.Machine(machine_id="m")) == "-"
    ok = machine_pb2.Machine(gpu_health=machine_pb2.GpuHealth(state=machine_pb2.GPU_HEALTH_STATE_OK))
    assert health(ok) == "ok"
