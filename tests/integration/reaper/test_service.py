"""ReaperService over real gRPC: watchdogs, the ledger, incidents, quarantines, bad input."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import grpc
import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Incident, Quarantine
from gpufleet.common.grpcserver import ServiceBinding, create_server
from gpufleet.common.ledger import record_failure
from gpufleet.common.trust.identity import Role
from gpufleet.reaper.service import ReaperService
from gpufleet.v1 import ledger_pb2, reaper_service_pb2, reaper_service_pb2_grpc
from tests.integration.reaper.conftest import Chain
from tests.support import tls
from tests.support.rich_errors import assert_bad_request, assert_refused, refusal


@dataclass
class Api:
    stub: reaper_service_pb2_grpc.ReaperServiceStub
    sessions: sessionmaker[Session]
    clock: ManualClock


@pytest.fixture
def api(pg_url: str) -> Iterator[Api]:
    clock = ManualClock()
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                reaper_service_pb2_grpc.add_ReaperServiceServicer_to_server,
                ReaperService(sessions, clock),
                reaper_service_pb2.DESCRIPTOR.services_by_name["ReaperService"].full_name,
            )
        ],
        max_workers=4,
        transport=tls.transport("reaper"),
    )
    with tls.channel(f"127.0.0.1:{server.port}", Role.REAPER) as channel:
        yield Api(reaper_service_pb2_grpc.ReaperServiceStub(channel), sessions, clock)
    server.stop(0)
    engine.dispose()


def _field(err: grpc.RpcError) -> str | None:
    for item in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if item.key == "gpufleet-field":
            return str(item.value)
    return None


def test_ledger_is_newest_first_paged_and_filtered(api: Api) -> None:
    now = api.clock.now()
    with api.sessions() as s, s.begin():
        for i in range(5):
            record_failure(
                s,
                now + timedelta(seconds=i),
                "went_silent" if i % 2 else "boot_failed",
                "went_silent" if i % 2 else "boot_failed",
                machine_id=f"m{i % 2}",
                details=str(i),
            )
    first = api.stub.ListLedgerEntries(reaper_service_pb2.ListLedgerEntriesRequest(page_size=2), timeout=5)
    assert [e.details for e in first.entries] == ["4", "3"]
    second = api.stub.ListLedgerEntries(
        reaper_service_pb2.ListLedgerEntriesRequest(page_size=2, page_token=first.next_page_token), timeout=5
    )
    assert [e.details for e in second.entries] == ["2", "1"]
    third = api.stub.ListLedgerEntries(
        reaper_service_pb2.ListLedgerEntriesRequest(page_size=2, page_token=second.next_page_token), timeout=5
    )
    assert [e.details for e in third.entries] == ["0"]
    assert third.next_page_token == ""
    silent = api.stub.ListLedgerEntries(
        reaper_service_pb2.ListLedgerEntriesRequest(failure_class="went_silent", machine_id="m1"), timeout=5
    )
    assert [e.details for e in silent.entries] == ["3", "1"]
    assert silent.entries[0].outcome == ledger_pb2.LEDGER_OUTCOME_REPLACE_MACHINE
    assert silent.entries[0].name == f"ledger/{silent.entries[0].entry_id}"
    by_detector = api.stub.ListLedgerEntries(
        reaper_service_pb2.ListLedgerEntriesRequest(detector="boot_failed"), timeout=5
    )
    assert [e.details for e in by_detector.entries] == ["4", "2", "0"]


@pytest.mark.parametrize(
    "token",
    [
        "%%%not-base64",
        paging.encode("incidents", 3),
        paging.encode("ledger", "x"),
        # A position no int64 column can hold: once a database error answered INTERNAL.
        paging.encode("ledger", 2**63),
        paging.encode("ledger", -1),
        paging.encode("ledger", True),
    ],
)
def test_a_bad_page_token_is_invalid_argument_naming_page_token(api: Api, token: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        api.stub.ListLedgerEntries(reaper_service_pb2.ListLedgerEntriesRequest(page_token=token), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert _field(info.value) == "page_token"


def test_other_bad_input_names_its_field(api: Api) -> None:
    calls = [
        (
            lambda: api.stub.ListIncidents(reaper_service_pb2.ListIncidentsRequest(page_size=-1), timeout=5),
            "page_size",
        ),
        (
            lambda: api.stub.ListIncidents(reaper_service_pb2.ListIncidentsRequest(state=99), timeout=5),
            "state",
        ),
        (
            lambda: api.stub.ListLedgerEntries(
                reaper_service_pb2.ListLedgerEntriesRequest(machine_id="x" * 65), timeout=5
            ),
            "machine_id",
        ),
        (
            lambda: api.stub.AcknowledgeIncident(reaper_service_pb2.AcknowledgeIncidentRequest(), timeout=5),
            "incident_id",
        ),
        (
            lambda: api.stub.ListWatchdogs(
                reaper_service_pb2.ListWatchdogsRequest(page_token=paging.encode("watchdogs", 7)), timeout=5
            ),
            "page_token",
        ),
    ]
    for call, field in calls:
        with pytest.raises(grpc.RpcError) as info:
            call()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field  # type: ignore[attr-defined]
        assert _field(info.value) == field


def test_every_bad_field_of_a_request_is_named_at_once(api: Api) -> None:
    """Decoded as any gRPC client decodes the standard rich error: one BadRequest naming
    every bad field with its reason, and nothing changed."""
    R = reaper_service_pb2
    paging_bad = [("page_size", "OUT_OF_RANGE"), ("page_token", "INVALID_PAGE_TOKEN")]
    long = "x" * 65
    cases = [
        (
            api.stub.ListWatchdogs,
            R.ListWatchdogsRequest(page_size=-1, page_token=paging.encode("watchdogs", 7)),
            paging_bad,
        ),
        (
            api.stub.ListLedgerEntries,
            R.ListLedgerEntriesRequest(
                page_size=-1, page_token="%%%", machine_id=long, failure_class=long, detector=long
            ),
            [
                *paging_bad,
                ("machine_id", "TOO_LONG"),
                ("failure_class", "TOO_LONG"),
                ("detector", "TOO_LONG"),
            ],
        ),
        (
            api.stub.ListIncidents,
            R.ListIncidentsRequest(page_size=-1, page_token=paging.encode("ledger", 1), state=99),
            [*paging_bad, ("state", "UNKNOWN_VALUE")],
        ),
        (
            api.stub.AcknowledgeIncident,
            R.AcknowledgeIncidentRequest(incident_id=-1, request_id="has spaces", acknowledged_by="x" * 129),
            [
                ("incident_id", "OUT_OF_RANGE"),
                ("request_id", "INVALID_FORMAT"),
                ("acknowledged_by", "TOO_LONG"),
            ],
        ),
        (
            api.stub.ListQuarantines,
            R.ListQuarantinesRequest(page_size=-1, page_token=paging.encode("quarantines", -1)),
            paging_bad,
        ),
        (
            api.stub.ClearQuarantine,
            R.ClearQuarantineRequest(request_id="has spaces"),
            [("quarantine_id", "REQUIRED"), ("request_id", "INVALID_FORMAT")],
        ),
    ]
    for method, request, expected in cases:
        assert_bad_request(refusal(method, request), expected)


def test_an_unknown_incident_or_quarantine_says_so_in_error_info(api: Api) -> None:
    got = refusal(
        api.stub.AcknowledgeIncident, reaper_service_pb2.AcknowledgeIncidentRequest(incident_id=999)
    )
    assert_refused(got, grpc.StatusCode.NOT_FOUND, "UNKNOWN_INCIDENT", "incident_id")
    got = refusal(api.stub.ClearQuarantine, reaper_service_pb2.ClearQuarantineRequest(quarantine_id=999))
    assert_refused(got, grpc.StatusCode.NOT_FOUND, "UNKNOWN_QUARANTINE", "quarantine_id")


def test_incidents_list_acknowledge_and_not_found(api: Api) -> None:
    now = api.clock.now()
    with api.sessions() as s, s.begin():
        s.add_all(
            [
                Incident(at=now, failure_class="provider_call_failed", machine_id="m1", summary="a"),
                Incident(at=now, failure_class="stockout", summary="b"),
            ]
        )
    listed = api.stub.ListIncidents(reaper_service_pb2.ListIncidentsRequest(), timeout=5)
    assert [i.summary for i in listed.incidents] == ["b", "a"]
    target = listed.incidents[1]
    api.clock.advance(60)
    acked = api.stub.AcknowledgeIncident(
        reaper_service_pb2.AcknowledgeIncidentRequest(
            incident_id=target.incident_id, acknowledged_by="ops@example.com", request_id="r1"
        ),
        timeout=5,
    )
    assert acked.state == ledger_pb2.INCIDENT_STATE_ACKNOWLEDGED
    assert acked.acknowledged_by == "ops@example.com"
    first_time = acked.acknowledge_time.ToDatetime()
    api.clock.advance(60)
    again = api.stub.AcknowledgeIncident(
        reaper_service_pb2.AcknowledgeIncidentRequest(
            incident_id=target.incident_id, acknowledged_by="someone-else"
        ),
        timeout=5,
    )
    assert (again.acknowledged_by, again.acknowledge_time.ToDatetime()) == ("ops@example.com", first_time)
    still_open = api.stub.ListIncidents(
        reaper_service_pb2.ListIncidentsRequest(state=ledger_pb2.INCIDENT_STATE_OPEN), timeout=5
    )
    assert [i.summary for i in still_open.incidents] == ["b"]
    with pytest.raises(grpc.RpcError) as info:
        api.stub.AcknowledgeIncident(
            reaper_service_pb2.AcknowledgeIncidentRequest(incident_id=999), timeout=5
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_quarantines_in_force_and_cleared(api: Api) -> None:
    now = api.clock.now()
    with api.sessions() as s, s.begin():
        s.add_all(
            [
                Quarantine(
                    kind="OFFERING",
                    offering_id="gcp-l4",
                    reason="stockout",
                    created_at=now,
                    expires_at=now + timedelta(hours=1),
                ),
                Quarantine(
                    kind="PROVIDER_REGION", provider="AWS", region="us-east-1", reason="quota", created_at=now
                ),
                Quarantine(
                    kind="OFFERING",
                    offering_id="old",
                    reason="x",
                    created_at=now,
                    expires_at=now - timedelta(seconds=1),
                ),
            ]
        )
    listed = api.stub.ListQuarantines(reaper_service_pb2.ListQuarantinesRequest(), timeout=5)
    assert [(q.kind, q.offering_id or q.region) for q in listed.quarantines] == [
        (ledger_pb2.QUARANTINE_KIND_PROVIDER_REGION, "us-east-1"),
        (ledger_pb2.QUARANTINE_KIND_OFFERING, "gcp-l4"),
    ]
    aws = listed.quarantines[0].quarantine_id
    api.stub.ClearQuarantine(
        reaper_service_pb2.ClearQuarantineRequest(quarantine_id=aws, request_id="c1"), timeout=5
    )
    api.stub.ClearQuarantine(
        reaper_service_pb2.ClearQuarantineRequest(quarantine_id=aws, request_id="c1"), timeout=5
    )
    after = api.stub.ListQuarantines(reaper_service_pb2.ListQuarantinesRequest(), timeout=5)
    assert [q.offering_id for q in after.quarantines] == ["gcp-l4"]
    api.clock.advance(timedelta(hours=1))
    assert (
        list(api.stub.ListQuarantines(reaper_service_pb2.ListQuarantinesRequest(), timeout=5).quarantines)
        == []
    )
    with pytest.raises(grpc.RpcError) as info:
        api.stub.ClearQuarantine(reaper_service_pb2.ClearQuarantineRequest(quarantine_id=12345), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]


def test_watchdogs_show_cadence_runs_and_refusals(chain: Chain) -> None:
    from tests.support.fleet_rows import add_machine

    now = chain.clock.now()
    add_machine(chain.sessions, now, origin="REGISTERED", stop_due_at=now)
    chain.tick()
    chain.step(30)
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                reaper_service_pb2_grpc.add_ReaperServiceServicer_to_server,
                ReaperService(chain.sessions, chain.clock),
                reaper_service_pb2.DESCRIPTOR.services_by_name["ReaperService"].full_name,
            )
        ],
        max_workers=2,
        transport=tls.transport("reaper"),
    )
    try:
        with tls.channel(f"127.0.0.1:{server.port}", Role.REAPER) as channel:
            stub = reaper_service_pb2_grpc.ReaperServiceStub(channel)
            pages = [stub.ListWatchdogs(reaper_service_pb2.ListWatchdogsRequest(page_size=3), timeout=5)]
            while pages[-1].next_page_token:
                pages.append(
                    stub.ListWatchdogs(
                        reaper_service_pb2.ListWatchdogsRequest(
                            page_size=3, page_token=pages[-1].next_page_token
                        ),
                        timeout=5,
                    )
                )
    finally:
        server.stop(0)
    dogs = {w.watchdog_id: w for page in pages for w in page.watchdogs}
    assert sorted(dogs) == [
        "auto_destroy",
        "auto_stop",
        "boot_failure",
        "gpu_fault",
        "idle_scanner",
        "lost_detector",
        "provision_deadline",
        "stuck_transition",
        "went_silent",
    ]
    stop = dogs["auto_stop"]
    assert (stop.service, stop.cadence.ToTimedelta(), stop.runs) == ("reaper", timedelta(seconds=30), 2)
    assert stop.last_run_time.ToDatetime().replace(tzinfo=chain.clock.now().tzinfo) == chain.clock.now()
    assert dict(stop.refusals) == {"NOT_OURS": 2}
    # The nets that ask every minute ran once in these 30 seconds; the registered box that
    # never reported is refused by boot failure at the first gate, and counted.
    for name in (
        "provision_deadline",
        "boot_failure",
        "went_silent",
        "lost_detector",
        "stuck_transition",
        "gpu_fault",
    ):
        assert (dogs[name].cadence.ToTimedelta(), dogs[name].runs) == (timedelta(seconds=60), 1), name
    assert dict(dogs["boot_failure"].refusals) == {"NOT_OURS": 1}
    assert dict(dogs["boot_failure"].actions) == {}
