"""The worker service validates what it stores: the address the control plane will dial,
the enum values, a completion's and a heartbeat's fields — one refusal naming every bad
field (the first also in the ``gpufleet-field`` trailer), nothing stored."""

from __future__ import annotations

from datetime import UTC, datetime

import grpc
import pytest
from sqlalchemy import func, select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.rich_status import details_of
from gpufleet.v1 import job_pb2, machine_pb2, worker_service_pb2, worker_service_pb2_grpc
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess


def register(**overrides: object) -> worker_service_pb2.RegisterMachineRequest:
    fields: dict[str, object] = {
        "request_id": "box-1",
        "machine_id": "box-1",
        "agent_address": "127.0.0.1:50060",
        "pool": "l4",
        "slots": 2,
        "workload_class": machine_pb2.WORKLOAD_CLASS_REPORTING,
    }
    fields.update(overrides)
    return worker_service_pb2.RegisterMachineRequest(**fields)  # type: ignore[arg-type]


def _machines_stored(pg_url: str) -> int:
    engine = make_engine(pg_url)
    try:
        with make_sessionmaker(engine)() as s:
            return s.execute(select(func.count()).select_from(models.Machine)).scalar_one()
    finally:
        engine.dispose()


BAD = [
    (register(agent_address=""), "agent_address"),
    (register(agent_address="127.0.0.1"), "agent_address"),
    (register(agent_address="127.0.0.1:0"), "agent_address"),
    (register(agent_address="127.0.0.1:99999"), "agent_address"),
    (register(agent_address="/var/run/agent.sock:1"), "agent_address"),
    (register(agent_address="http://evil:80"), "agent_address"),
    (register(agent_address="host; rm -rf /:22"), "agent_address"),
    (register(workload_class=42), "workload_class"),
    (register(slots=0), "slots"),
    (register(pool="Not A Pool"), "pool"),
]


@pytest.mark.parametrize(("request_msg", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_a_bad_registration_names_its_field_and_stores_nothing(
    scheduler: ServiceProcess, pg_url: str, request_msg: worker_service_pb2.RegisterMachineRequest, field: str
) -> None:
    with scheduler.channel("machine:box-1") as channel:
        with pytest.raises(grpc.RpcError) as info:
            worker_service_pb2_grpc.WorkerServiceStub(channel).RegisterMachine(request_msg, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert dict(info.value.trailing_metadata() or ()).get("gpufleet-field") == field  # type: ignore[attr-defined]
    assert _machines_stored(pg_url) == 0


def test_a_machines_resource_name_is_accepted_where_its_id_is(scheduler: ServiceProcess) -> None:
    from gpufleet.v1 import fleet_service_pb2, fleet_service_pb2_grpc

    with scheduler.channel("machine:box-1") as box_channel, scheduler.channel() as channel:
        box = worker_service_pb2_grpc.WorkerServiceStub(box_channel).RegisterMachine(register(), timeout=5)
        fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
        assert box.name == "machines/box-1"
        got = fleet.GetMachine(fleet_service_pb2.GetMachineRequest(machine_id=box.name), timeout=5)
        cordoned = fleet.CordonMachine(fleet_service_pb2.CordonMachineRequest(machine_id=box.name), timeout=5)
    assert got.machine_id == "box-1" and cordoned.cordoned


def test_a_good_registration_with_a_name_or_ipv6_is_stored(scheduler: ServiceProcess) -> None:
    with scheduler.channel("machine:box-1") as one, scheduler.channel("machine:box-2") as two:
        named = worker_service_pb2_grpc.WorkerServiceStub(one).RegisterMachine(
            register(agent_address="gpu-box-1.lab.internal:50060"), timeout=5
        )
        v6 = worker_service_pb2_grpc.WorkerServiceStub(two).RegisterMachine(
            register(request_id="box-2", machine_id="box-2", agent_address="[::1]:50060"), timeout=5
        )
    assert named.agent_address == "gpu-box-1.lab.internal:50060" and v6.agent_address == "[::1]:50060"


def test_a_malformed_request_id_on_an_idempotent_call_is_refused_naming_it(scheduler: ServiceProcess) -> None:
    from gpufleet.v1 import fleet_service_pb2, fleet_service_pb2_grpc

    with scheduler.channel("machine:box-1") as box_channel, scheduler.channel() as channel:
        worker_service_pb2_grpc.WorkerServiceStub(box_channel).RegisterMachine(register(), timeout=5)
        fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            fleet.CordonMachine(
                fleet_service_pb2.CordonMachineRequest(machine_id="box-1", request_id="not ok!"), timeout=5
            )
        # Well formed, or absent: cordoning twice answers the machine as it is.
        first = fleet.CordonMachine(
            fleet_service_pb2.CordonMachineRequest(machine_id="box-1", request_id="c-1"), timeout=5
        )
        again = fleet.CordonMachine(
            fleet_service_pb2.CordonMachineRequest(machine_id="box-1", request_id="c-1"), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert dict(info.value.trailing_metadata() or ()).get("gpufleet-field") == "request_id"  # type: ignore[attr-defined]
    assert first.cordoned and again == first


def _refusal(call: object) -> list[tuple[str, str]]:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    return [(v.field, v.reason) for v in details_of(info.value).violations]


def test_a_registration_wrong_in_several_fields_names_each_one(
    scheduler: ServiceProcess, pg_url: str
) -> None:
    bad = register(agent_address="http://evil:80", pool="Not A Pool", workload_class=42, slots=0)
    with scheduler.channel("machine:box-1") as channel:
        stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
        assert _refusal(lambda: stub.RegisterMachine(bad, timeout=5)) == [
            ("agent_address", "INVALID_FORMAT"),
            ("pool", "INVALID_FORMAT"),
            ("workload_class", "UNKNOWN_VALUE"),
            ("slots", "OUT_OF_RANGE"),
        ]
    assert _machines_stored(pg_url) == 0


def test_a_completion_or_heartbeat_wrong_in_several_fields_names_each_one(
    scheduler: ServiceProcess, pg_url: str
) -> None:
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    now = datetime.now(UTC)
    machine = add_machine(sessions, now)
    attempt = add_attempt(sessions, now, machine)
    bad_completion = worker_service_pb2.ReportCompletionRequest(
        machine_id=machine, attempt_id="../a", outcome=job_pb2.ATTEMPT_STATE_RUNNING, slot_seconds=-1
    )
    health = machine_pb2.GpuHealth(
        state=99, findings=[machine_pb2.GpuFinding(kind="", severity=7, gpu_index=-2, count=-1)]
    )
    bad_heartbeat = worker_service_pb2.ReportHeartbeatRequest(
        machine_id=machine, running=[worker_service_pb2.RunningAttempt(attempt_id=attempt)], gpu_health=health
    )
    try:
        with scheduler.channel(f"machine:{machine}") as channel:
            stub = worker_service_pb2_grpc.WorkerServiceStub(channel)
            assert _refusal(lambda: stub.ReportCompletion(bad_completion, timeout=5)) == [
                ("attempt_id", "INVALID_FORMAT"),
                ("outcome", "UNKNOWN_VALUE"),
                ("slot_seconds", "OUT_OF_RANGE"),
            ]
            assert _refusal(lambda: stub.ReportHeartbeat(bad_heartbeat, timeout=5)) == [
                ("gpu_health.state", "UNKNOWN_VALUE"),
                ("gpu_health.findings[0].kind", "INVALID_FORMAT"),
                ("gpu_health.findings[0].severity", "UNKNOWN_VALUE"),
                ("gpu_health.findings[0].gpu_index", "OUT_OF_RANGE"),
                ("gpu_health.findings[0].count", "OUT_OF_RANGE"),
            ]
        # Nothing written: the attempt still runs on its old lease, the machine's report
        # clock did not move.
        with sessions() as s:
            row = s.get_one(models.Attempt, attempt)
            assert row.state == "RUNNING" and row.ended_at is None
            assert s.get_one(models.Machine, machine).worker_report_at is None
    finally:
        engine.dispose()
