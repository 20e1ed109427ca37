"""SweeperService over real gRPC: RunSweep, ListSweeps, ListOrphans and bad input."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, timedelta

import grpc
import pytest

from gpufleet.common import paging
from gpufleet.common.grpcserver import ServiceBinding, create_server
from gpufleet.common.trust.identity import Role
from gpufleet.sweeper.service import SweeperService
from gpufleet.v1 import machine_pb2, provisioner_service_pb2, sweeper_service_pb2, sweeper_service_pb2_grpc
from tests.integration.sweeper.conftest import Sweep
from tests.support import tls
from tests.support.fleet_rows import add_machine, machine
from tests.support.rich_errors import assert_bad_request, assert_refused, refusal


@pytest.fixture
def stub(sweep: Sweep) -> Iterator[sweeper_service_pb2_grpc.SweeperServiceStub]:
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                sweeper_service_pb2_grpc.add_SweeperServiceServicer_to_server,
                SweeperService(sweep.sessions, sweep.clock, sweep.reconcile, sweep.orphans, sweep.lease),
                sweeper_service_pb2.DESCRIPTOR.services_by_name["SweeperService"].full_name,
            )
        ],
        max_workers=4,
        transport=tls.transport("sweeper"),
    )
    with tls.channel(f"127.0.0.1:{server.port}", Role.SWEEPER) as channel:
        yield sweeper_service_pb2_grpc.SweeperServiceStub(channel)
    server.stop(0)


def _field(err: grpc.RpcError) -> str | None:
    for item in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if item.key == "gpufleet-field":
            return str(item.value)
    return None


RECONCILE = sweeper_service_pb2.SWEEP_KIND_INVENTORY_RECONCILE
ORPHANS = sweeper_service_pb2.SWEEP_KIND_ORPHAN_SWEEP


def test_run_sweep_runs_now_even_without_the_lease_and_is_idempotent(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    now = sweep.clock.now()
    mid = add_machine(sweep.sessions, now)
    sweep.provisioner.list_instance(mid, machine(sweep.sessions, mid).provider_instance_id or "")
    assert not sweep.lease.is_leader
    done = stub.RunSweep(sweeper_service_pb2.RunSweepRequest(request_id="r1", kind=RECONCILE), timeout=10)
    assert (done.kind, done.instances_seen, done.machines_updated) == (RECONCILE, 1, 1)
    assert done.name == f"sweeps/{done.sweep_id}"
    assert machine(sweep.sessions, mid).provider_seen_at == now
    again = stub.RunSweep(sweeper_service_pb2.RunSweepRequest(request_id="r1", kind=RECONCILE), timeout=10)
    assert again.sweep_id == done.sweep_id
    assert len(sweep.provisioner.ops("list")) == 1


def test_list_sweeps_newest_first_paged_by_kind(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    for i in range(3):
        stub.RunSweep(sweeper_service_pb2.RunSweepRequest(request_id=f"r{i}", kind=RECONCILE), timeout=10)
    sweep.tick()  # the leader's own passes are recorded too (a reconcile and an orphan sweep)
    first = stub.ListSweeps(sweeper_service_pb2.ListSweepsRequest(page_size=3, kind=RECONCILE), timeout=5)
    rest = stub.ListSweeps(
        sweeper_service_pb2.ListSweepsRequest(page_size=3, page_token=first.next_page_token, kind=RECONCILE),
        timeout=5,
    )
    ids = [s.sweep_id for s in [*first.sweeps, *rest.sweeps]]
    assert len(ids) == 4 and ids == sorted(ids, reverse=True)
    assert rest.next_page_token == ""
    orphans = stub.ListSweeps(sweeper_service_pb2.ListSweepsRequest(kind=ORPHANS), timeout=5)
    assert [s.kind for s in orphans.sweeps] == [ORPHANS]
    every = stub.ListSweeps(sweeper_service_pb2.ListSweepsRequest(), timeout=5)
    assert len(every.sweeps) == 5


def test_list_orphans_is_empty_before_any_sweep(stub: sweeper_service_pb2_grpc.SweeperServiceStub) -> None:
    page = stub.ListOrphans(sweeper_service_pb2.ListOrphansRequest(), timeout=5)
    assert (list(page.orphans), page.next_page_token) == ([], "")


def test_run_orphan_sweep_needs_the_lease_and_is_idempotent(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    sweep.provisioner.list_instance("m-orphan", "i-orphan")
    request = sweeper_service_pb2.RunSweepRequest(request_id="o1", kind=ORPHANS)
    assert not sweep.lease.is_leader
    with pytest.raises(grpc.RpcError) as info:
        stub.RunSweep(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
    assert "leader" in (info.value.details() or "")  # type: ignore[attr-defined]
    assert sweep.provisioner.ops("list") == []
    assert sweep.lease.try_acquire()
    done = stub.RunSweep(request, timeout=10)
    assert (done.kind, done.instances_seen, done.orphans_seen, done.orphans_destroyed) == (ORPHANS, 1, 1, 0)
    again = stub.RunSweep(request, timeout=10)
    assert again.sweep_id == done.sweep_id and len(sweep.provisioner.ops("list")) == 1
    with pytest.raises(grpc.RpcError) as reused:
        stub.RunSweep(sweeper_service_pb2.RunSweepRequest(request_id="o1", kind=RECONCILE), timeout=10)
    assert reused.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert _field(reused.value) == "request_id"


def test_list_orphans_shows_each_orphan_paged_newest_first(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    for i in range(3):
        sweep.provisioner.list_instance(f"m-orphan-{i}", f"i-orphan-{i}")
    assert sweep.lease.try_acquire()
    first_seen = sweep.clock.now()
    stub.RunSweep(sweeper_service_pb2.RunSweepRequest(kind=ORPHANS), timeout=10)
    sweep.clock.advance(timedelta(minutes=30))
    done = stub.RunSweep(sweeper_service_pb2.RunSweepRequest(kind=ORPHANS), timeout=10)
    assert (done.orphans_seen, done.orphans_destroyed) == (3, 3)
    assert [c.machine_id for c in sweep.provisioner.ops("destroy")] == [f"m-orphan-{i}" for i in range(3)]
    page = stub.ListOrphans(sweeper_service_pb2.ListOrphansRequest(page_size=2), timeout=5)
    rest = stub.ListOrphans(
        sweeper_service_pb2.ListOrphansRequest(page_size=2, page_token=page.next_page_token), timeout=5
    )
    orphans = [*page.orphans, *rest.orphans]
    assert rest.next_page_token == ""
    assert [o.machine_label for o in orphans] == ["m-orphan-2", "m-orphan-1", "m-orphan-0"]
    newest = orphans[0]
    assert newest.name == "orphans/sim/i-orphan-2"
    assert (newest.provider, newest.provider_instance_id, newest.action) == (
        machine_pb2.PROVIDER_SIM,
        "i-orphan-2",
        "DESTROYED",
    )
    assert newest.first_seen_time.ToDatetime(tzinfo=UTC) == first_seen
    assert newest.destroy_time.ToDatetime(tzinfo=UTC) == sweep.clock.now()
    assert not newest.HasField("launch_time")  # the scripted provider gives none


def test_run_reconcile_on_a_replica_that_does_not_lead_leaves_conclusions_to_the_leader(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    now = sweep.clock.now()
    spot = add_machine(sweep.sessions, now, capacity_type="SPOT")
    sweep.provisioner.list_instance(
        spot,
        machine(sweep.sessions, spot).provider_instance_id or "",
        status=provisioner_service_pb2.INSTANCE_STATUS_STOPPED,
    )
    stub.RunSweep(sweeper_service_pb2.RunSweepRequest(kind=RECONCILE), timeout=10)
    assert (machine(sweep.sessions, spot).state, machine(sweep.sessions, spot).preemption_count) == (
        "READY",
        0,
    )
    assert sweep.failures() == []
    assert sweep.lease.try_acquire()
    done = stub.RunSweep(sweeper_service_pb2.RunSweepRequest(kind=RECONCILE), timeout=10)
    assert "1 spot stopped" in done.summary
    assert (machine(sweep.sessions, spot).state, machine(sweep.sessions, spot).preemption_count) == (
        "STOPPED",
        1,
    )


@pytest.mark.parametrize(
    ("request_", "code", "field"),
    [
        (sweeper_service_pb2.RunSweepRequest(), grpc.StatusCode.INVALID_ARGUMENT, "kind"),
        (sweeper_service_pb2.RunSweepRequest(kind=42), grpc.StatusCode.INVALID_ARGUMENT, "kind"),
        (
            sweeper_service_pb2.RunSweepRequest(kind=RECONCILE, request_id="x" * 129),
            grpc.StatusCode.INVALID_ARGUMENT,
            "request_id",
        ),
        (
            sweeper_service_pb2.ListSweepsRequest(page_token="@@bad"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token",
        ),
        (
            sweeper_service_pb2.ListSweepsRequest(page_token=paging.encode("sweeps", "x")),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token",
        ),
        (
            sweeper_service_pb2.ListOrphansRequest(page_token="@@bad"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token",
        ),
        (sweeper_service_pb2.ListSweepsRequest(kind=9), grpc.StatusCode.INVALID_ARGUMENT, "kind"),
    ],
)
def test_bad_input_names_its_field(
    stub: sweeper_service_pb2_grpc.SweeperServiceStub, request_: object, code: grpc.StatusCode, field: str
) -> None:
    method = {
        sweeper_service_pb2.RunSweepRequest: stub.RunSweep,
        sweeper_service_pb2.ListSweepsRequest: stub.ListSweeps,
        sweeper_service_pb2.ListOrphansRequest: stub.ListOrphans,
    }[type(request_)]
    with pytest.raises(grpc.RpcError) as info:
        method(request_, timeout=5)
    assert info.value.code() == code  # type: ignore[attr-defined]
    assert _field(info.value) == field


def test_every_bad_field_of_a_request_is_named_at_once(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    """Decoded as any gRPC client decodes the standard rich error: one BadRequest naming
    every bad field with its reason, and no pass run."""
    S = sweeper_service_pb2
    cases = [
        (
            stub.ListSweeps,
            S.ListSweepsRequest(page_size=-1, page_token="@@bad", kind=9),
            [("page_size", "OUT_OF_RANGE"), ("page_token", "INVALID_PAGE_TOKEN"), ("kind", "UNKNOWN_VALUE")],
        ),
        (
            stub.ListOrphans,
            S.ListOrphansRequest(page_size=-1, page_token=paging.encode("orphans", "x")),
            [("page_size", "OUT_OF_RANGE"), ("page_token", "INVALID_PAGE_TOKEN")],
        ),
        (
            stub.RunSweep,
            S.RunSweepRequest(request_id="x" * 129),
            [("request_id", "TOO_LONG"), ("kind", "REQUIRED")],
        ),
        (
            stub.RunSweep,
            S.RunSweepRequest(request_id="x" * 129, kind=42),
            [("request_id", "TOO_LONG"), ("kind", "UNKNOWN_VALUE")],
        ),
    ]
    for method, request, expected in cases:
        assert_bad_request(refusal(method, request), expected)
    assert sweep.provisioner.ops("list") == []


def test_refusals_of_run_sweep_say_why_in_error_info(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    got = refusal(stub.RunSweep, sweeper_service_pb2.RunSweepRequest(request_id="o1", kind=ORPHANS))
    assert_refused(got, grpc.StatusCode.FAILED_PRECONDITION, "NOT_LEADER")
    stub.RunSweep(sweeper_service_pb2.RunSweepRequest(request_id="r1", kind=RECONCILE), timeout=10)
    # The key already stands for a reconcile: a program reads why from ErrorInfo, a person
    # from the one field violation.
    got = refusal(stub.RunSweep, sweeper_service_pb2.RunSweepRequest(request_id="r1", kind=ORPHANS))
    assert (got.code, got.reason, got.field) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "REQUEST_ID_REUSED",
        "request_id",
    )
    assert got.violations == [("request_id", "REQUEST_ID_REUSED")]


def test_a_sweep_names_the_providers_it_could_not_list(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    sweep.provisioner.unreachable = [machine_pb2.PROVIDER_AWS]
    done = stub.RunSweep(sweeper_service_pb2.RunSweepRequest(kind=RECONCILE), timeout=10)
    assert list(done.unreachable) == [machine_pb2.PROVIDER_AWS]
    assert "AWS" in done.summary
