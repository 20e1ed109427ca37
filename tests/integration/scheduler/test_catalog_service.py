"""CatalogService through a real scheduler process, real gRPC with TLS and real PostgreSQL:
the pools, job kinds and plans a backend needs to build a valid request, readable by the
backend and operators and by no other part."""

from __future__ import annotations

import grpc
import pytest

from gpufleet.common.trust.identity import Role
from gpufleet.v1 import catalog_service_pb2, catalog_service_pb2_grpc, fleet_service_pb2
from tests.support.procs import ServiceProcess


@pytest.mark.parametrize("who", [Role.BACKEND, Role.OPERATOR])
def test_the_front_door_reads_pools_kinds_and_plans(scheduler: ServiceProcess, who: Role) -> None:
    with scheduler.channel(who) as channel:
        catalogue = catalog_service_pb2_grpc.CatalogServiceStub(channel)
        pools = catalogue.ListPools(fleet_service_pb2.ListPoolsRequest(), timeout=5)
        kinds = catalogue.ListJobKinds(catalog_service_pb2.ListJobKindsRequest(), timeout=5)
        plans = catalogue.ListPlans(catalog_service_pb2.ListPlansRequest(), timeout=5)

    (pool,) = pools.pools
    assert (pool.name, pool.pool_id, pool.slots_per_machine) == ("pools/l4", "l4", 2)
    assert [o.offering_id for o in pool.offerings] == ["local-l4"]
    by_id = {k.kind_id: k for k in kinds.job_kinds}
    assert list(by_id) == ["clip", "film", "short_episode"]
    # What SubmitJob fills in for a job that leaves them out.
    assert {(k.default_pool, k.default_pipeline_version) for k in kinds.job_kinds} == {("l4", "2026.12.0")}
    film = by_id["film"]
    assert (film.name, film.slots, film.resumes_from_checkpoint) == ("kinds/film", 0, True)
    assert film.time_limit.ToTimedelta().total_seconds() == 9 * 3600
    assert film.expected_duration.ToTimedelta().total_seconds() == 4 * 3600
    assert film.memory_limit_bytes == 32768 << 20
    assert [(p.plan_id, p.tier, p.max_gpu_jobs) for p in plans.plans] == [("creator", 1, 2), ("studio", 2, 4)]
    assert not (pools.next_page_token or kinds.next_page_token or plans.next_page_token)


def test_kinds_page_by_id(scheduler: ServiceProcess) -> None:
    with scheduler.channel(Role.BACKEND) as channel:
        catalogue = catalog_service_pb2_grpc.CatalogServiceStub(channel)
        first = catalogue.ListJobKinds(catalog_service_pb2.ListJobKindsRequest(page_size=2), timeout=5)
        rest = catalogue.ListJobKinds(
            catalog_service_pb2.ListJobKindsRequest(page_size=2, page_token=first.next_page_token), timeout=5
        )
        with pytest.raises(grpc.RpcError) as bad:
            catalogue.ListPlans(
                catalog_service_pb2.ListPlansRequest(page_token=first.next_page_token), timeout=5
            )
    assert [k.kind_id for k in first.job_kinds] == ["clip", "film"]
    assert [k.kind_id for k in rest.job_kinds] == ["short_episode"] and not rest.next_page_token
    # A kinds token is no plans token.
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


@pytest.mark.parametrize("who", [Role.GATEWAY, Role.REAPER])
def test_other_parts_are_refused(scheduler: ServiceProcess, who: Role) -> None:
    with scheduler.channel(who) as channel:
        catalogue = catalog_service_pb2_grpc.CatalogServiceStub(channel)
        for call in (
            lambda: catalogue.ListPools(fleet_service_pb2.ListPoolsRequest(), timeout=5),
            lambda: catalogue.ListJobKinds(catalog_service_pb2.ListJobKindsRequest(), timeout=5),
            lambda: catalogue.ListPlans(catalog_service_pb2.ListPlansRequest(), timeout=5),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
