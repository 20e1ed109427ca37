"""An operator deregisters a self-registered box, through a real scheduler process on
real PostgreSQL and through the CLI: only a registered box, only when no attempt holds it;
after, it is neither listed nor routed to, and its reports are refused."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime

import grpc
import pytest
from sqlalchemy import update

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import fleet_service_pb2, fleet_service_pb2_grpc, machine_pb2, worker_service_pb2
from gpufleet.v1 import worker_service_pb2_grpc as worker_grpc
from tests.support import tls
from tests.support.fleet_rows import add_attempt, add_machine
from tests.support.procs import ServiceProcess


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code()  # type: ignore[attr-defined,no-any-return]


def test_a_registered_box_is_deregistered_and_nothing_else_is(scheduler: ServiceProcess, pg_url: str) -> None:
    sessions = make_sessionmaker(make_engine(pg_url))
    now = datetime.now(UTC)
    provisioned = add_machine(sessions, now)
    with scheduler.channel("machine:box-d") as box_channel, scheduler.channel() as channel:
        box = worker_grpc.WorkerServiceStub(box_channel)
        fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
        box.RegisterMachine(
            worker_service_pb2.RegisterMachineRequest(
                request_id="box-d",
                agent_address="127.0.0.1:50060",
                pool="l4",
                slots=1,
                workload_class=machine_pb2.WORKLOAD_CLASS_REPORTING,
            ),
            timeout=10,
        )

        def deregister(machine_id: str) -> machine_pb2.Machine:
            request = fleet_service_pb2.DeregisterMachineRequest(machine_id=machine_id)
            return fleet.DeregisterMachine(request, timeout=10)  # type: ignore[no-any-return]

        assert code_of(lambda: deregister("nobody")) == grpc.StatusCode.NOT_FOUND
        assert code_of(lambda: deregister(provisioned)) == grpc.StatusCode.FAILED_PRECONDITION
        attempt = add_attempt(sessions, now, "box-d")
        assert code_of(lambda: deregister("box-d")) == grpc.StatusCode.FAILED_PRECONDITION
        with sessions() as s, s.begin():
            s.execute(
                update(models.Attempt)
                .where(models.Attempt.id == attempt)
                .values(state="SUCCEEDED", ended_at=now, holds_slot=False)
            )

        # Through the CLI, as an operator does it.
        cli = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet.cli",
                "machines",
                "deregister",
                "box-d",
                "--scheduler",
                scheduler.address,
            ],
            env={
                **os.environ,
                **{k: v for k, v in tls.env("operator").items() if k.startswith("GPUFLEET_TLS_")},
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert "box-d deregistered" in cli.stdout

        again = deregister("box-d")  # idempotent: answered as it is
        assert again.state == machine_pb2.MACHINE_STATE_DESTROYED
        listed = fleet.ListMachines(fleet_service_pb2.ListMachinesRequest(), timeout=10).machines
        assert "box-d" not in [m.machine_id for m in listed]
        assert provisioned in [m.machine_id for m in listed]
        assert (
            code_of(
                lambda: box.ReportHeartbeat(
                    worker_service_pb2.ReportHeartbeatRequest(machine_id="box-d"), timeout=10
                )
            )
            == grpc.StatusCode.FAILED_PRECONDITION
        )
    with sessions() as s:
        row = s.get_one(models.Machine, "box-d")
        assert (row.state, row.state_changed_by) == ("DESTROYED", "operator")
        assert s.get_one(models.Machine, provisioned).state == "READY"
