"""CatalogService: the catalogue read-only — pools, job kinds, plans — for the product
backend (which must know them to build a valid SubmitJob or CreateWorkspace) and for
operators. It reads the store, where the scheduler syncs the catalogue file at start, so
every API process answers the same."""

from __future__ import annotations

from collections import defaultdict

import grpc
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.convert import dur, offering_to_proto, ts
from gpufleet.common.db import models
from gpufleet.v1 import catalog_pb2, catalog_service_pb2, catalog_service_pb2_grpc, fleet_service_pb2

MIB = 1 << 20


def list_pools(
    sessions: sessionmaker[Session], request: fleet_service_pb2.ListPoolsRequest
) -> fleet_service_pb2.ListPoolsResponse:
    """One page of pools by id, each with its offerings in order of preference (also
    FleetService.ListPools)."""
    size, after = paging.keyed_page("pools", request.page_size, request.page_token)
    with sessions() as session:
        pools = list(
            session.execute(
                select(models.Pool).where(models.Pool.id > after).order_by(models.Pool.id).limit(size + 1)
            ).scalars()
        )
        more = len(pools) > size
        pools = pools[:size]
        offerings: dict[str, list[models.Offering]] = defaultdict(list)
        if pools:
            for o in session.execute(
                select(models.Offering)
                .where(models.Offering.pool_id.in_([p.id for p in pools]))
                .order_by(models.Offering.pool_id, models.Offering.rank)
            ).scalars():
                offerings[o.pool_id].append(o)
        out = [
            catalog_pb2.Pool(
                name=f"pools/{pool.id}",
                pool_id=pool.id,
                gpu_model=pool.gpu_model,
                slots_per_machine=pool.slots_per_machine,
                warm_target=pool.warm_target,
                max_machines=pool.max_machines,
                idle_since=ts(pool.idle_since),
                offerings=[offering_to_proto(o) for o in offerings[pool.id]],
            )
            for pool in pools
        ]
    return fleet_service_pb2.ListPoolsResponse(
        pools=out, next_page_token=paging.encode("pools", pools[-1].id) if more else ""
    )


def job_kind_to_proto(kind: models.JobKind) -> catalog_pb2.JobKind:
    return catalog_pb2.JobKind(
        name=f"kinds/{kind.id}",
        kind_id=kind.id,
        slots=kind.slots,
        time_limit=dur(kind.time_limit_s),
        runs_writer_code=kind.runs_writer_code,
        queue_wait_deadline=dur(kind.queue_wait_deadline_s),
        retry_budget=kind.retry_budget,
        lost_retry_budget=kind.lost_retry_budget,
        resumes_from_checkpoint=kind.resumes_from_checkpoint,
        memory_limit_bytes=kind.memory_limit_mb * MIB,
        pids_limit=kind.pids_limit,
        default_pool=kind.default_pool or "",
        default_pipeline_version=kind.default_pipeline_version or "",
        expected_duration=None if kind.expected_duration_s is None else dur(kind.expected_duration_s),
    )


def plan_to_proto(plan: models.Plan) -> catalog_pb2.Plan:
    return catalog_pb2.Plan(
        name=f"plans/{plan.id}",
        plan_id=plan.id,
        tier=plan.tier,
        weight=plan.weight,
        max_gpu_jobs=plan.max_gpu_jobs,
        rate_micros=plan.rate_micros,
    )


class CatalogService(catalog_service_pb2_grpc.CatalogServiceServicer):
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def ListPools(
        self, request: fleet_service_pb2.ListPoolsRequest, context: grpc.ServicerContext
    ) -> fleet_service_pb2.ListPoolsResponse:
        return list_pools(self.sessions, request)

    def ListJobKinds(
        self, request: catalog_service_pb2.ListJobKindsRequest, context: grpc.ServicerContext
    ) -> catalog_service_pb2.ListJobKindsResponse:
        size, after = paging.keyed_page("kinds", request.page_size, request.page_token)
        K = models.JobKind
        with self.sessions() as session:
            query = select(K).where(K.id > after).order_by(K.id).limit(size + 1)
            kinds = list(session.execute(query).scalars())
        more = len(kinds) > size
        kinds = kinds[:size]
        return catalog_service_pb2.ListJobKindsResponse(
            job_kinds=[job_kind_to_proto(k) for k in kinds],
            next_page_token=paging.encode("kinds", kinds[-1].id) if more else "",
        )

    def ListPlans(
        self, request: catalog_service_pb2.ListPlansRequest, context: grpc.ServicerContext
    ) -> catalog_service_pb2.ListPlansResponse:
        size, after = paging.keyed_page("plans", request.page_size, request.page_token)
        P = models.Plan
        with self.sessions() as session:
            query = select(P).where(P.id > after).order_by(P.id).limit(size + 1)
            plans = list(session.execute(query).scalars())
        more = len(plans) > size
        plans = plans[:size]
        return catalog_service_pb2.ListPlansResponse(
            plans=[plan_to_proto(p) for p in plans],
            next_page_token=paging.encode("plans", plans[-1].id) if more else "",
        )
