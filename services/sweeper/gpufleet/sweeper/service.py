"""SweeperService: the sweeper's passes, the orphans they saw, and running a pass now.

RunSweep(INVENTORY_RECONCILE) runs on whichever replica receives it. On the leader it is
the full pass, fenced; on any other replica it writes only the observation —
``provider_seen_at`` moved forward to when the list was read, which a stale epoch cannot
make wrong — and leaves every conclusion (a pre-emption, a vanished instance) to the
leader. RunSweep(ORPHAN_SWEEP) destroys, so only the leader runs it; another replica
answers FAILED_PRECONDITION (reason NOT_LEADER). Bad input is one INVALID_ARGUMENT
naming every bad field.
"""

from __future__ import annotations

import grpc
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clock import Clock
from gpufleet.common.convert import enum_name
from gpufleet.common.db.models import Orphan, Sweep
from gpufleet.common.errors import FailedPrecondition, InvalidArgument, Violation
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.violations import Violations
from gpufleet.sweeper import orphan_rows, sweeps
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from gpufleet.sweeper.orphan_sweep import OrphanSweep
from gpufleet.sweeper.sweeps import SweepResult
from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc


class SweeperService(sweeper_service_pb2_grpc.SweeperServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        reconcile: InventoryReconcile,
        orphans: OrphanSweep,
        lease: LeaderLease,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.reconcile = reconcile
        self.orphans = orphans
        self.lease = lease

    def ListSweeps(
        self, request: sweeper_service_pb2.ListSweepsRequest, context: grpc.ServicerContext
    ) -> sweeper_service_pb2.ListSweepsResponse:
        """Newest first; ``kind`` unset lists every kind."""
        found = Violations()
        size = paging.page_size(request.page_size, found)
        after = paging.decode_int("sweeps", request.page_token, found)
        found.known(request.kind, sweeper_service_pb2.SweepKind.values(), "kind", "sweep kind")
        found.raise_if_any()
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
        """Every instance the orphan sweep found with no record here, the most recently
        found first: when it launched and when a sweep first saw it (its age runs from the
        launch, or from the first sighting when the provider gave no launch time; its grace
        window from the later of the two), what was done about it and when it was destroyed."""
        found = Violations()
        size = paging.page_size(request.page_size, found)
        after = paging.decode_int("orphans", request.page_token, found)
        found.raise_if_any()
        query = select(Orphan).order_by(Orphan.id.desc())
        if after is not None:
            query = query.where(Orphan.id < after)
        with self.sessions() as session:
            rows = list(session.execute(query.limit(size + 1)).scalars())
        more = len(rows) > size
        rows = rows[:size]
        return sweeper_service_pb2.ListOrphansResponse(
            orphans=[orphan_rows.to_proto(r) for r in rows],
            next_page_token=paging.encode("orphans", rows[-1].id) if more else "",
        )

    def RunSweep(
        self, request: sweeper_service_pb2.RunSweepRequest, context: grpc.ServicerContext
    ) -> sweeper_service_pb2.Sweep:
        """Run one pass now and return it; the same ``request_id`` returns the same pass."""
        found = Violations()
        found.at_most(request.request_id, "request_id", MAX_REQUEST_ID)
        if not request.kind:
            found.add(
                "kind", "is required: SWEEP_KIND_INVENTORY_RECONCILE or SWEEP_KIND_ORPHAN_SWEEP", "REQUIRED"
            )
        found.known(request.kind, sweeper_service_pb2.SweepKind.values(), "kind", "sweep kind")
        found.raise_if_any()
        kind = _kind_name(request.kind)
        previous = sweeps.find_by_request(self.sessions, request.request_id)
        if previous is not None:
            if previous.kind != kind:
                why = f"request_id was already used for a {previous.kind} sweep"
                raise InvalidArgument.of(
                    [Violation("request_id", why, "REQUEST_ID_REUSED")], reason="REQUEST_ID_REUSED"
                )
            return sweeps.to_proto(previous)
        leading = self.lease.is_leader
        result: SweepResult
        if kind == sweeps.ORPHAN_SWEEP:
            if not leading:
                raise FailedPrecondition(
                    "this sweeper replica does not hold the leader lease; only the leader runs "
                    "the orphan sweep (try again, or ask the leader)",
                    reason="NOT_LEADER",
                )
            result = self.orphans.run(self.clock.now(), self.lease)
        else:
            result = self.reconcile.reconcile(self.clock.now(), lease=self.lease if leading else None)
        row = sweeps.record(
            self.sessions, kind, result, self.clock.now(), request_id=request.request_id or None
        )
        return sweeps.to_proto(row)


# RunSweep's request_id: any text up to this long (the proto promises no more).
MAX_REQUEST_ID = 128


def _kind_name(number: int) -> str:
    """A checked SweepKind's stored name."""
    return enum_name(sweeper_service_pb2.SweepKind, "SWEEP_KIND_", number)
