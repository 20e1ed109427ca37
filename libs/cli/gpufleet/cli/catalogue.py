"""``gpufleet pools | kinds | plans``: the catalogue, read over CatalogService — what a job
can name (a pool, a kind and what SubmitJob fills in when it names none) and what a
workspace can be on — with, for an operator, the machines each pool holds now."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from gpufleet.cli import credentials, output
from gpufleet.cli.client import pages, run_client
from gpufleet.cli.machines import list_machines
from gpufleet.cli.output import Col
from gpufleet.common.errors import PermissionDenied
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    catalog_pb2,
    catalog_service_pb2,
    catalog_service_pb2_grpc,
    fleet_service_pb2,
    machine_pb2,
)


def _stub(args: argparse.Namespace) -> catalog_service_pb2_grpc.CatalogServiceStub:
    return catalog_service_pb2_grpc.CatalogServiceStub(
        credentials.channel(args, args.scheduler, Role.SCHEDULER)
    )


def offering_label(o: machine_pb2.Offering) -> str:
    return f"{o.offering_id} ({output.money(o.hourly_price_micros)}/h)"


def seconds(d: Any) -> str:
    """A Duration as a person reads it ("-" when unset)."""
    if not d.seconds and not d.nanos:
        return "-"
    s = d.ToTimedelta().total_seconds()
    return f"{s / 3600:g}h" if s >= 3600 and s % 360 == 0 else f"{s / 60:g}m" if s >= 60 else f"{s:g}s"


def pools(args: argparse.Namespace) -> int:
    rows: list[catalog_pb2.Pool] = pages(
        _stub(args).ListPools, fleet_service_pb2.ListPoolsRequest(page_size=200), "pools"
    )
    if args.json:
        output.print_json(rows)
        return 0
    try:
        live = list_machines(args, include_destroyed=False)
    except PermissionDenied:  # a backend certificate reads the catalogue, not the fleet
        live = None
    counts = Counter(m.pool for m in live or [])
    busy: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for m in live or []:
        busy[m.pool] += m.slots_busy
        total[m.pool] += m.slots_total
    print(
        output.table(
            [
                "POOL",
                "GPU",
                "SLOTS/MACHINE",
                "WARM",
                "MAX MACHINES",
                "MACHINES",
                "BUSY SLOTS",
                Col("OFFERINGS (IN ORDER)", flexible=True, min_width=12),
            ],
            [
                [
                    p.pool_id,
                    p.gpu_model,
                    str(p.slots_per_machine),
                    str(p.warm_target),
                    str(p.max_machines),
                    str(counts[p.pool_id]) if live is not None else "?",
                    f"{busy[p.pool_id]}/{total[p.pool_id]}" if live is not None else "?",
                    ", ".join(offering_label(o) for o in p.offerings) or "-",
                ]
                for p in rows
            ],
        )
    )
    return 0


def kinds(args: argparse.Namespace) -> int:
    rows: list[catalog_pb2.JobKind] = pages(
        _stub(args).ListJobKinds, catalog_service_pb2.ListJobKindsRequest(page_size=200), "job_kinds"
    )
    if args.json:
        output.print_json(rows)
        return 0
    print(
        output.table(
            [
                "KIND",
                "SLOTS",
                "DEFAULT POOL",
                Col("DEFAULT VERSION", flexible=True),
                "TIME LIMIT",
                Col("EXPECTED", optional=True),
                Col("QUEUE WAIT", optional=True),
                Col("RETRIES", optional=True),
                Col("MEMORY", optional=True),
                Col("FLAGS", flexible=True),
            ],
            [
                [
                    k.kind_id,
                    str(k.slots) if k.slots else "whole machine",
                    k.default_pool or "-",
                    k.default_pipeline_version or "-",
                    seconds(k.time_limit),
                    seconds(k.expected_duration),
                    seconds(k.queue_wait_deadline),
                    f"{k.retry_budget} own, {k.lost_retry_budget} lost",
                    f"{k.memory_limit_bytes / (1 << 30):g} GiB" if k.memory_limit_bytes else "-",
                    ",".join(
                        f
                        for f, on in (
                            ("writer-code", k.runs_writer_code),
                            ("checkpoints", k.resumes_from_checkpoint),
                        )
                        if on
                    )
                    or "-",
                ]
                for k in rows
            ],
        )
    )
    return 0


def plans(args: argparse.Namespace) -> int:
    rows: list[catalog_pb2.Plan] = pages(
        _stub(args).ListPlans, catalog_service_pb2.ListPlansRequest(page_size=200), "plans"
    )
    if args.json:
        output.print_json(rows)
        return 0
    print(
        output.table(
            ["PLAN", "TIER", "WEIGHT", "MAX GPU JOBS", "RATE"],
            [
                [p.plan_id, str(p.tier), f"{p.weight:g}", str(p.max_gpu_jobs), f"x{p.rate_micros / 1e6:g}"]
                for p in rows
            ],
        )
    )
    return 0


def add_parsers(client: Any) -> None:
    p = client("pools", "the pools: GPU, slots per machine, limits, machines now, offerings in order")
    p.set_defaults(func=lambda a: run_client(pools, a))
    k = client("kinds", "the job kinds: slots, the pool and version a job gets by default, limits")
    k.set_defaults(func=lambda a: run_client(kinds, a))
    pl = client("plans", "the plans a workspace can be on: tier, fair-share weight, concurrency, rate")
    pl.set_defaults(func=lambda a: run_client(plans, a))
