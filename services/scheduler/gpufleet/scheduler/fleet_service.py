"""FleetService: the operators' view of machines (all three liveness channels and their
composite), pools and workspaces, and cordoning."""

from __future__ import annotations

import logging

import grpc
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clock import Clock
from gpufleet.common.convert import enum_name, machine_to_proto
from gpufleet.common.db import models
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, MachineIntent, MachineOrigin, MachineState
from gpufleet.common.errors import FailedPrecondition, NotFound
from gpufleet.common.lifecycle import Actor, record
from gpufleet.common.violations import Violations
from gpufleet.scheduler import validation
from gpufleet.scheduler.catalog_service import list_pools
from gpufleet.scheduler.validation import IDENT
from gpufleet.scheduler.workspace_service import list_workspaces
from gpufleet.v1 import catalog_pb2, fleet_service_pb2, fleet_service_pb2_grpc, machine_pb2

log = logging.getLogger(__name__)


def _busy_slots(session: Session, machine_ids: list[str]) -> dict[str, int]:
    if not machine_ids:
        return {}
    rows = session.execute(
        select(models.Attempt.machine_id, func.sum(models.Attempt.slots))
        .where(
            models.Attempt.machine_id.in_(machine_ids),
            models.Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
        )
        .group_by(models.Attempt.machine_id)
    ).all()
    return {mid: int(n or 0) for mid, n in rows}


def unknown_machine(machine_id: str) -> NotFound:
    return NotFound(f"no machine {machine_id!r}", field="machine_id", reason="UNKNOWN_MACHINE")


def _machine_id(request_id: str, machine_id: str) -> str:
    """A cordon's, uncordon's or deregister's machine id and optional request id, checked
    at once."""
    found = Violations()
    machine_id = validation.machine_id(machine_id, found)
    validation.optional_request_id(request_id, found)
    found.raise_if_any()
    return machine_id


class FleetService(fleet_service_pb2_grpc.FleetServiceServicer):
    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self.sessions = sessions
        self.clock = clock

    def ListMachines(
        self, request: fleet_service_pb2.ListMachinesRequest, context: grpc.ServicerContext
    ) -> fleet_service_pb2.ListMachinesResponse:
        found = Violations()
        size = paging.page_size(request.page_size, found)
        after = paging.decode_str("machines", request.page_token, found)
        found.check(request.pool, "pool", IDENT, "pool id", required=False)
        found.known(request.state, machine_pb2.MachineState.values(), "state", "machine state")
        found.raise_if_any()
        query = select(models.Machine)
        if not request.include_destroyed:
            query = query.where(models.Machine.state != MachineState.DESTROYED.value)
        if request.pool:
            query = query.where(models.Machine.pool_id == request.pool)
        if request.state:
            query = query.where(
                models.Machine.state == enum_name(machine_pb2.MachineState, "MACHINE_STATE_", request.state)
            )
        if after:
            query = query.where(models.Machine.id > after)
        with self.sessions() as session:
            rows = list(session.execute(query.order_by(models.Machine.id).limit(size + 1)).scalars())
            more = len(rows) > size
            rows = rows[:size]
            busy = _busy_slots(session, [m.id for m in rows])
        return fleet_service_pb2.ListMachinesResponse(
            machines=[machine_to_proto(m, busy.get(m.id, 0)) for m in rows],
            next_page_token=paging.encode("machines", rows[-1].id) if more else "",
        )

    def GetMachine(
        self, request: fleet_service_pb2.GetMachineRequest, context: grpc.ServicerContext
    ) -> machine_pb2.Machine:
        machine_id = validation.machine_id(request.machine_id)
        with self.sessions() as session:
            machine = session.get(models.Machine, machine_id)
            if machine is None:
                raise unknown_machine(machine_id)
            return machine_to_proto(machine, _busy_slots(session, [machine_id]).get(machine_id, 0))

    def _set_cordon(self, machine_id: str, cordoned: bool) -> machine_pb2.Machine:
        with self.sessions() as session, session.begin():
            machine = session.get(models.Machine, machine_id)
            if machine is None:
                raise unknown_machine(machine_id)
            if machine.state == MachineState.DESTROYED.value:
                raise FailedPrecondition(
                    "machine is destroyed", field="machine_id", reason="MACHINE_DESTROYED"
                )
            machine.cordoned = cordoned
            session.flush()
            return machine_to_proto(machine, _busy_slots(session, [machine_id]).get(machine_id, 0))

    def CordonMachine(
        self, request: fleet_service_pb2.CordonMachineRequest, context: grpc.ServicerContext
    ) -> machine_pb2.Machine:
        return self._set_cordon(_machine_id(request.request_id, request.machine_id), True)

    def UncordonMachine(
        self, request: fleet_service_pb2.UncordonMachineRequest, context: grpc.ServicerContext
    ) -> machine_pb2.Machine:
        return self._set_cordon(_machine_id(request.request_id, request.machine_id), False)

    def DeregisterMachine(
        self, request: fleet_service_pb2.DeregisterMachineRequest, context: grpc.ServicerContext
    ) -> machine_pb2.Machine:
        machine_id = _machine_id(request.request_id, request.machine_id)
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            machine = session.get(models.Machine, machine_id, with_for_update=True)
            if machine is None:
                raise unknown_machine(machine_id)
            if machine.origin != MachineOrigin.REGISTERED.value:
                raise FailedPrecondition(
                    "this platform provisioned it: the money chain stops and destroys it, "
                    "it is not deregistered",
                    field="machine_id",
                    reason="MACHINE_PROVISIONED",
                )
            if machine.state != MachineState.DESTROYED.value:
                busy = _busy_slots(session, [machine_id]).get(machine_id, 0)
                live = session.execute(
                    select(func.count())
                    .select_from(models.Attempt)
                    .where(
                        models.Attempt.machine_id == machine_id,
                        models.Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
                    )
                ).scalar_one()
                if live or busy:
                    raise FailedPrecondition(
                        f"{live} attempt(s) run on it: cordon it and let them finish first",
                        field="machine_id",
                        reason="MACHINE_BUSY",
                    )
                record(
                    machine,
                    MachineState.DESTROYED,
                    by=Actor.OPERATOR,
                    why="deregistered by an operator",
                    now=now,
                )
                machine.intent = MachineIntent.DESTROYED.value
                log.info("machine %s deregistered", machine_id, extra={"fields": {"machine_id": machine_id}})
            session.flush()
            return machine_to_proto(machine, 0)

    def ListPools(
        self, request: fleet_service_pb2.ListPoolsRequest, context: grpc.ServicerContext
    ) -> fleet_service_pb2.ListPoolsResponse:
        return list_pools(self.sessions, request)

    def GetSystemTime(
        self, request: fleet_service_pb2.GetSystemTimeRequest, context: grpc.ServicerContext
    ) -> fleet_service_pb2.SystemTime:
        """The control plane's clock, so a client shows ages against the time the system
        counts them by (not its own wall clock, which `--speed` leaves behind)."""
        reply = fleet_service_pb2.SystemTime()
        reply.now.FromDatetime(self.clock.now())
        return reply

    def ListWorkspaces(
        self, request: catalog_pb2.ListWorkspacesRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.ListWorkspacesResponse:
        return list_workspaces(self.sessions, request)
