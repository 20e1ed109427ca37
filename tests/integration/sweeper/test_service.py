"""SweeperService over real gRPC: RunSweep, ListSweeps, ListOrphans and bad input."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from gpufleet.common import paging
from gpufleet.common.grpcserver import ServiceBinding, create_server
from gpufleet.sweeper.service import SweeperService
from gpufleet.v1 import machine_pb2, sweeper_service_pb2, sweeper_service_pb2_grpc
from tests.integration.sweeper.conftest import Sweep
from tests.support.fleet_rows import add_machine, machine


@pytest.fixture
def stub(sweep: Sweep) -> Iterator[sweeper_service_pb2_grpc.SweeperServiceStub]:
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                sweeper_service_pb2_grpc.add_SweeperServiceServicer_to_server,
                SweeperService(sweep.sessions, sweep.clock, sweep.reconcile),
                sweeper_service_pb2.DESCRIPTOR.services_by_name["SweeperService"].full_name,
            )
        ],
        max_workers=4,
    )
    with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield sweeper_service_pb2_grpc.SweeperServiceStub(channel)
    server.stop(0)


def _field(err: grpc.RpcError) -> str | None:
    for item in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if item.key == "gpufleet-field":
            return str(item.value)
    return None


RECONCILE = sweeper_service_pb2.SWEEP_KIND_INVENTORY_RECONCILE


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
    sweep.tick()  # the leader's own pass is recorded too
    first = stub.ListSweeps(sweeper_service_pb2.ListSweepsRequest(page_size=3, kind=RECONCILE), timeout=5)
    rest = stub.ListSweeps(
        sweeper_service_pb2.ListSweepsRequest(page_size=3, page_token=first.next_page_token), timeout=5
    )
    ids = [s.sweep_id for s in [*first.sweeps, *rest.sweeps]]
    assert len(ids) == 4 and ids == sorted(ids, reverse=True)
    assert rest.next_page_token == ""
    orphans = stub.ListSweeps(
        sweeper_service_pb2.ListSweepsRequest(kind=sweeper_service_pb2.SWEEP_KIND_ORPHAN_SWEEP), timeout=5
    )
    assert list(orphans.sweeps) == []


def test_list_orphans_is_an_empty_page_for_now(stub: sweeper_service_pb2_grpc.SweeperServiceStub) -> None:
    page = stub.ListOrphans(sweeper_service_pb2.ListOrphansRequest(), timeout=5)
    assert (list(page.orphans), page.next_page_token) == ([], "")


@pytest.mark.parametrize(
    ("request_", "code", "field"),
    [
        (sweeper_service_pb2.RunSweepRequest(), grpc.StatusCode.INVALID_ARGUMENT, "kind"),
        (sweeper_service_pb2.RunSweepRequest(kind=42), grpc.StatusCode.INVALID_ARGUMENT, "kind"),
        (
            sweeper_service_pb2.RunSweepRequest(kind=sweeper_service_pb2.SWEEP_KIND_ORPHAN_SWEEP),
            grpc.StatusCode.FAILED_PRECONDITION,
            "kind",
        ),
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


def test_a_sweep_names_the_providers_it_could_not_list(
    sweep: Sweep, stub: sweeper_service_pb2_grpc.SweeperServiceStub
) -> None:
    sweep.provisioner.unreachable = [machine_pb2.PROVIDER_AWS]
    done = stub.RunSweep(sweeper_service_pb2.RunSweepRequest(kind=RECONCILE), timeout=10)
    assert list(done.unreachable) == [machine_pb2.PROVIDER_AWS]
    assert "AWS" in done.summary
