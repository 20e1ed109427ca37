"""``gpufleet pools``: the catalogue's pools, each with the machines it holds now."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from gpufleet.cli import output
from gpufleet.cli.client import fleet_stub, pages, run_client
from gpufleet.cli.machines import list_machines
from gpufleet.cli.output import Col
from gpufleet.v1 import catalog_pb2, fleet_service_pb2, machine_pb2


def list_pools(args: argparse.Namespace) -> list[catalog_pb2.Pool]:
    return pages(fleet_stub(args).ListPools, fleet_service_pb2.ListPoolsRequest(page_size=200), "pools")


def offering_label(o: machine_pb2.Offering) -> str:
    return f"{o.offering_id} ({output.money(o.hourly_price_micros)}/h)"


def pools(args: argparse.Namespace) -> int:
    rows = list_pools(args)
    if args.json:
        output.print_json(rows)
        return 0
    live = list_machines(args, include_destroyed=False)
    machines = Counter(m.pool for m in live)
    busy = Counter({pool: sum(m.slots_busy for m in live if m.pool == pool) for pool in machines})
    total = Counter({pool: sum(m.slots_total for m in live if m.pool == pool) for pool in machines})
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
                    str(machines[p.pool_id]),
                    f"{busy[p.pool_id]}/{total[p.pool_id]}",
                    ", ".join(offering_label(o) for o in p.offerings) or "-",
                ]
                for p in rows
            ],
        )
    )
    return 0


def add_parsers(client: Any) -> None:
    p = client("pools", "the pools: GPU, slots per machine, limits, machines now, offerings in order")
    p.set_defaults(func=lambda a: run_client(pools, a))
