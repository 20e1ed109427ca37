"""ReaperService: watchdog status, the failure ledger, incidents and quarantines.

Read-mostly operator API over tables the watchdogs write. Every List is paged with an
opaque token (``gpufleet.common.paging``); bad input is one INVALID_ARGUMENT naming every
bad field, an unknown id is NOT_FOUND (UNKNOWN_INCIDENT, UNKNOWN_QUARANTINE).
Acknowledging an incident or clearing a quarantine twice is harmless, so both are
idempotent without storing ``request_id``.
"""

from __future__ import annotations

from typing import Any

import grpc
from sqlalchemy import Select, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clock import Clock
from gpufleet.common.convert import dur, enum_name, ts
from gpufleet.common.db.enums import IncidentState
from gpufleet.common.db.models import Failure, Incident, Quarantine, WatchdogStat
from gpufleet.common.errors import NotFound
from gpufleet.common.idempotency import optional_request_id
from gpufleet.common.ledger import in_force_sql
from gpufleet.common.violations import Violations
from gpufleet.v1 import ledger_pb2, reaper_service_pb2, reaper_service_pb2_grpc

_MAX_FILTER = 64
_MAX_ACKNOWLEDGED_BY = 128


def _newest_first(kind: str, page_size: int, page_token: str, found: Violations) -> tuple[int, int | None]:
    """A list newest first by row id: the page's size and the id it starts below (None
    for the first page)."""
    return paging.page_size(page_size, found), paging.decode_int(kind, page_token, found)


def _positive_id(value: int, field: str, what: str, found: Violations) -> None:
    if value <= 0:
        found.add(field, f"must be a positive {what} id", "REQUIRED" if value == 0 else "OUT_OF_RANGE")


def _enum_or_unspecified(enum_type: Any, prefix: str, name: str) -> Any:
    """The proto enum member for a stored name; a name the protos do not know reads UNSPECIFIED."""
    full = prefix + name
    return full if full in enum_type.DESCRIPTOR.values_by_name else prefix + "UNSPECIFIED"


def _page(session: Session, query: Select[Any], size: int) -> tuple[list[Any], bool]:
    rows = list(session.execute(query.limit(size + 1)).scalars())
    return rows[:size], len(rows) > size


def watchdog_to_proto(row: WatchdogStat) -> ledger_pb2.Watchdog:
    return ledger_pb2.Watchdog(
        name=f"watchdogs/{row.name}",
        watchdog_id=row.name,
        service=row.service,
        cadence=dur(row.cadence_s),
        last_run_time=ts(row.last_run_at),
        runs=row.runs or 0,
        actions={k: int(v) for k, v in (row.actions or {}).items()},
        refusals={k: int(v) for k, v in (row.refusals or {}).items()},
    )


def ledger_entry_to_proto(row: Failure) -> ledger_pb2.LedgerEntry:
    return ledger_pb2.LedgerEntry(
        name=f"ledger/{row.id}",
        entry_id=row.id,
        create_time=ts(row.at),
        machine_id=row.machine_id or "",
        job_id=row.job_id or "",
        attempt_id=row.attempt_id or "",
        failure_class=row.failure_class,
        detector=row.detector,
        details=row.details,
        outcome=_enum_or_unspecified(ledger_pb2.LedgerOutcome, "LEDGER_OUTCOME_", row.outcome),
    )


def incident_to_proto(row: Incident) -> ledger_pb2.Incident:
    return ledger_pb2.Incident(
        name=f"incidents/{row.id}",
        incident_id=row.id,
        create_time=ts(row.at),
        failure_class=row.failure_class,
        machine_id=row.machine_id or "",
        job_id=row.job_id or "",
        summary=row.summary,
        state=_enum_or_unspecified(ledger_pb2.IncidentState, "INCIDENT_STATE_", row.state),
        acknowledge_time=ts(row.acknowledged_at),
        acknowledged_by=row.acknowledged_by or "",
        resolve_time=ts(row.resolved_at),
    )


def quarantine_to_proto(row: Quarantine) -> ledger_pb2.Quarantine:
    return ledger_pb2.Quarantine(
        name=f"quarantines/{row.id}",
        quarantine_id=row.id,
        kind=_enum_or_unspecified(ledger_pb2.QuarantineKind, "QUARANTINE_KIND_", row.kind),
        offering_id=row.offering_id or "",
        provider=row.provider or "",
        region=row.region or "",
        reason=row.reason,
        create_time=ts(row.created_at),
        expire_time=ts(row.expires_at),
    )


class ReaperService(reaper_service_pb2_grpc.ReaperServiceServicer):  # type: ignore[misc]
    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self.sessions = sessions
        self.clock = clock

    def ListWatchdogs(
        self, request: reaper_service_pb2.ListWatchdogsRequest, context: grpc.ServicerContext
    ) -> reaper_service_pb2.ListWatchdogsResponse:
        """Every service's watchdogs (the Ticker registers each), by name."""
        size, after = paging.keyed_page("watchdogs", request.page_size, request.page_token)
        query = select(WatchdogStat).order_by(WatchdogStat.name)
        if after:
            query = query.where(WatchdogStat.name > after)
        with self.sessions() as session:
            rows, more = _page(session, query, size)
        return reaper_service_pb2.ListWatchdogsResponse(
            watchdogs=[watchdog_to_proto(r) for r in rows],
            next_page_token=paging.encode("watchdogs", rows[-1].name) if more else "",
        )

    def ListLedgerEntries(
        self, request: reaper_service_pb2.ListLedgerEntriesRequest, context: grpc.ServicerContext
    ) -> reaper_service_pb2.ListLedgerEntriesResponse:
        """Newest first; filters combine with AND."""
        found = Violations()
        size, after = _newest_first("ledger", request.page_size, request.page_token, found)
        found.at_most(request.machine_id, "machine_id", _MAX_FILTER)
        found.at_most(request.failure_class, "failure_class", _MAX_FILTER)
        found.at_most(request.detector, "detector", _MAX_FILTER)
        found.raise_if_any()
        query = select(Failure).order_by(Failure.id.desc())
        if request.machine_id:
            query = query.where(Failure.machine_id == request.machine_id)
        if request.failure_class:
            query = query.where(Failure.failure_class == request.failure_class)
        if request.detector:
            query = query.where(Failure.detector == request.detector)
        if after is not None:
            query = query.where(Failure.id < after)
        with self.sessions() as session:
            rows, more = _page(session, query, size)
        return reaper_service_pb2.ListLedgerEntriesResponse(
            entries=[ledger_entry_to_proto(r) for r in rows],
            next_page_token=paging.encode("ledger", rows[-1].id) if more else "",
        )

    def ListIncidents(
        self, request: reaper_service_pb2.ListIncidentsRequest, context: grpc.ServicerContext
    ) -> reaper_service_pb2.ListIncidentsResponse:
        """Newest first; ``state`` unset lists every state."""
        found = Violations()
        size, after = _newest_first("incidents", request.page_size, request.page_token, found)
        found.known(request.state, ledger_pb2.IncidentState.values(), "state", "incident state")
        found.raise_if_any()
        query = select(Incident).order_by(Incident.id.desc())
        if request.state:
            query = query.where(
                Incident.state == enum_name(ledger_pb2.IncidentState, "INCIDENT_STATE_", request.state)
            )
        if after is not None:
            query = query.where(Incident.id < after)
        with self.sessions() as session:
            rows, more = _page(session, query, size)
        return reaper_service_pb2.ListIncidentsResponse(
            incidents=[incident_to_proto(r) for r in rows],
            next_page_token=paging.encode("incidents", rows[-1].id) if more else "",
        )

    def AcknowledgeIncident(
        self, request: reaper_service_pb2.AcknowledgeIncidentRequest, context: grpc.ServicerContext
    ) -> ledger_pb2.Incident:
        """Idempotent: acknowledging an acknowledged incident returns it unchanged."""
        found = Violations()
        _positive_id(request.incident_id, "incident_id", "incident", found)
        optional_request_id(request.request_id, found)
        found.at_most(request.acknowledged_by, "acknowledged_by", _MAX_ACKNOWLEDGED_BY)
        found.raise_if_any()
        who = request.acknowledged_by
        with self.sessions() as session, session.begin():
            row = session.get(Incident, request.incident_id, with_for_update=True)
            if row is None:
                raise NotFound(
                    f"no incident {request.incident_id}", field="incident_id", reason="UNKNOWN_INCIDENT"
                )
            if row.acknowledged_at is None:
                # A resolved incident stays resolved; it still records who read it.
                if row.state == IncidentState.OPEN.value:
                    row.state = IncidentState.ACKNOWLEDGED.value
                row.acknowledged_at = self.clock.now()
                row.acknowledged_by = who or None
            return incident_to_proto(row)

    def ListQuarantines(
        self, request: reaper_service_pb2.ListQuarantinesRequest, context: grpc.ServicerContext
    ) -> reaper_service_pb2.ListQuarantinesResponse:
        """Quarantines in force now (not cleared, not expired), newest first."""
        found = Violations()
        size, after = _newest_first("quarantines", request.page_size, request.page_token, found)
        found.raise_if_any()
        now = self.clock.now()
        query = select(Quarantine).where(*in_force_sql(now)).order_by(Quarantine.id.desc())
        if after is not None:
            query = query.where(Quarantine.id < after)
        with self.sessions() as session:
            rows, more = _page(session, query, size)
        return reaper_service_pb2.ListQuarantinesResponse(
            quarantines=[quarantine_to_proto(r) for r in rows],
            next_page_token=paging.encode("quarantines", rows[-1].id) if more else "",
        )

    def ClearQuarantine(
        self, request: reaper_service_pb2.ClearQuarantineRequest, context: grpc.ServicerContext
    ) -> reaper_service_pb2.ClearQuarantineResponse:
        """A human ends a quarantine now; clearing a cleared one succeeds."""
        found = Violations()
        _positive_id(request.quarantine_id, "quarantine_id", "quarantine", found)
        optional_request_id(request.request_id, found)
        found.raise_if_any()
        with self.sessions() as session, session.begin():
            row = session.get(Quarantine, request.quarantine_id, with_for_update=True)
            if row is None:
                raise NotFound(
                    f"no quarantine {request.quarantine_id}",
                    field="quarantine_id",
                    reason="UNKNOWN_QUARANTINE",
                )
            if row.cleared_at is None:
                row.cleared_at = self.clock.now()
        return reaper_service_pb2.ClearQuarantineResponse()
