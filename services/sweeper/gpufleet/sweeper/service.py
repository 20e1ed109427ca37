"""SweeperService: the sweeper's passes, orphans, and running a pass now.

RunSweep runs on whichever replica receives it, leader or not. That is safe because the
only write an inventory reconcile makes is an observation — ``provider_seen_at`` moved
forward to the time the list was read — never a decision; a write that only ever moves a
timestamp forward cannot be made wrong by a stale epoch, so the manual pass is not
fenced (the timed pass, run by the leader, is). The orphan sweep, which destroys, comes
with a later issue and will be leader-only.
"""

from __future__ import annotations

import grpc
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clock import Clock
from gpufleet.common.convert import enum_name
from gpufleet.common.db.models import Sweep
from gpufleet.common.errors import FailedPrecondition, InvalidArgument
from gpufleet.sweeper import sweeps
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc


class SweeperService(sweeper_service_pb2_grpc.SweeperServiceServicer):  # type: ignore[misc]
    def __init__(self, sessions: sessionmaker[Session], clock: Clock, reconcile: InventoryReconcile) -> None:
        self.sessions = sessions
        self.clock = clock
        self.reconcile = reconcile

    def ListSweeps(
        self, request: sweeper_service_pb2.ListSweepsRequest, context: grpc.ServicerContext
    ) -> sweeper_service_pb2.ListSweepsResponse:
        """Newest first; ``kind`` unset lists every kind."""
        size = paging.page_size(request.page_size)
        after = paging.decode("sweeps", request.page_token)
        if after is not None and (not isinstance(after, int) or isinstance(after, bool)):
            raise InvalidArgument("malformed page token", field="page_token")
        query = select(Sweep).order_by(Sweep.id.desc())
        if request.kind:
            query = query.where(Sweep.kind == _kind_name(request.kind))
        if after is not None:
            query = query.where(Sweep.id < after)
        with self.sessions() as session:
            rows = list(session.execute(query.limit(size + 1)).scalars())
        more = len(rows) > size
        rows = rows[:size]
        return sweeper_service_pb2.ListSweepsResponse(
            sweeps=[sweeps.to_proto(r) for r in rows],
            next_page_token=paging.encode("sweeps", rows[-1].id) if more else "",
        )

    def ListOrphans(
        self, request: sweeper_service_pb2.ListOrphansRequest, context: grpc.ServicerContext
    ) -> sweeper_service_pb2.ListOrphansResponse:
        """Always an empty page for now: the orphan sweep arrives with a later issue.

        The request is still validated, so a client written today keeps working then.
        """
        paging.page_size(request.page_size)
        paging.decode("orphans", request.page_token)
        return sweeper_service_pb2.ListOrphansResponse()

    def RunSweep(
        self, request: sweeper_service_pb2.RunSweepRequest, context: grpc.ServicerContext
    ) -> sweeper_service_pb2.Sweep:
        """Run one pass now and return it; the same ``request_id`` returns the same pass."""
        if len(request.request_id) > 128:
            raise InvalidArgument("longer than 128 characters", field="request_id")
        kind = _kind_name(request.kind) if request.kind else ""
        if kind != sweeps.INVENTORY_RECONCILE:
            if kind == sweeps.ORPHAN_SWEEP:
                raise FailedPrecondition("the orphan sweep is not available in this version", field="kind")
            raise InvalidArgument("must be SWEEP_KIND_INVENTORY_RECONCILE", field="kind")
        previous = sweeps.find_by_request(self.sessions, request.request_id)
        if previous is not None:
            return sweeps.to_proto(previous)
        result = self.reconcile.reconcile(self.clock.now(), lease=None)
        row = sweeps.record(
            self.sessions,
            sweeps.INVENTORY_RECONCILE,
            result,
            self.clock.now(),
            request_id=request.request_id or None,
        )
        return sweeps.to_proto(row)


def _kind_name(number: int) -> str:
    if number not in sweeper_service_pb2.SweepKind.values():
        raise InvalidArgument("unknown sweep kind", field="kind")
    return enum_name(sweeper_service_pb2.SweepKind, "SWEEP_KIND_", number)
