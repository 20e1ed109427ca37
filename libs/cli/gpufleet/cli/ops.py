"""Operator commands over the reaper and the sweeper:

gpufleet watchdogs                      every watchdog: cadence, last run, actions, refusals
gpufleet ledger [--machine M] [--class C]   the failure ledger, newest first
gpufleet incidents [--open] / gpufleet incidents ack ID
gpufleet quarantines / gpufleet quarantines clear ID
gpufleet orphans [--sweep-now]          what the orphan sweeps saw and did
"""

from __future__ import annotations

import argparse
import os
import uuid
from datetime import datetime
from typing import Any

from gpufleet.cli import addresses, credentials, output
from gpufleet.cli.client import pages, run_client, system_now
from gpufleet.cli.output import Col
from gpufleet.common import grpcclient
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    ledger_pb2,
    machine_pb2,
    reaper_service_pb2,
    reaper_service_pb2_grpc,
    sweeper_service_pb2,
    sweeper_service_pb2_grpc,
)

TIMEOUT_S = 10.0


def _reaper(args: argparse.Namespace) -> reaper_service_pb2_grpc.ReaperServiceStub:
    return reaper_service_pb2_grpc.ReaperServiceStub(credentials.channel(args, args.reaper, Role.REAPER))


def _sweeper(args: argparse.Namespace) -> sweeper_service_pb2_grpc.SweeperServiceStub:
    return sweeper_service_pb2_grpc.SweeperServiceStub(credentials.channel(args, args.sweeper, Role.SWEEPER))


def _now(args: argparse.Namespace) -> datetime:
    """The time ages are shown against: the system's clock — the caller's (the demo's) or
    the scheduler's own (FleetService.GetSystemTime)."""
    return system_now(args)


def _counts(counts: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(counts.items())) or "-"


def watchdogs(args: argparse.Namespace) -> int:
    rows = pages(
        _reaper(args).ListWatchdogs, reaper_service_pb2.ListWatchdogsRequest(page_size=200), "watchdogs"
    )
    if args.json:
        output.print_json(rows)
        return 0
    now = _now(args)
    print(
        output.table(
            [
                "WATCHDOG",
                "SERVICE",
                "EVERY",
                "LAST RUN",
                "RUNS",
                Col("ACTIONS", flexible=True),
                Col("REFUSALS", flexible=True),
            ],
            [
                [
                    w.watchdog_id,
                    w.service,
                    f"{w.cadence.ToTimedelta().total_seconds():g}s",
                    output.when(w.last_run_time, now),
                    str(w.runs),
                    _counts(w.actions),
                    _counts(w.refusals),
                ]
                for w in rows
            ],
        )
    )
    return 0


def ledger(args: argparse.Namespace) -> int:
    request = reaper_service_pb2.ListLedgerEntriesRequest(
        page_size=min(args.limit, 1000),
        machine_id=args.machine or "",
        failure_class=args.failure_class or "",
        detector=args.detector or "",
    )
    rows = pages(_reaper(args).ListLedgerEntries, request, "entries", limit=args.limit)
    if args.json:
        output.print_json(rows)
        return 0
    if not rows:
        print("the failure ledger is empty: nothing has failed")
        return 0
    now = _now(args)
    print(
        output.table(
            [
                "ID",
                "WHEN",
                "CLASS",
                "DETECTOR",
                "OUTCOME",
                "MACHINE",
                "JOB",
                Col("DETAILS", flexible=True, min_width=12),
            ],
            [
                [
                    str(e.entry_id),
                    output.when(e.create_time, now),
                    e.failure_class,
                    e.detector,
                    output.enum_short(ledger_pb2.LedgerOutcome, e.outcome, "LEDGER_OUTCOME_"),
                    e.machine_id[:8] or "-",
                    e.job_id[:8] or "-",
                    e.details,
                ]
                for e in rows
            ],
        )
    )
    return 0


def incidents(args: argparse.Namespace) -> int:
    stub = _reaper(args)
    if args.action == "ack":
        if args.id is None:
            raise SystemExit("gpufleet: incidents ack needs an incident id")
        incident = grpcclient.call(
            stub.AcknowledgeIncident,
            reaper_service_pb2.AcknowledgeIncidentRequest(
                incident_id=args.id, request_id=str(uuid.uuid4()), acknowledged_by=args.by
            ),
            timeout=TIMEOUT_S,
            idempotent=True,
        )
        if args.json:
            output.print_json(incident)
        else:
            print(f"incident {incident.incident_id} acknowledged by {incident.acknowledged_by}")
        return 0
    state = ledger_pb2.INCIDENT_STATE_OPEN if args.open else ledger_pb2.INCIDENT_STATE_UNSPECIFIED
    rows = pages(
        stub.ListIncidents, reaper_service_pb2.ListIncidentsRequest(page_size=200, state=state), "incidents"
    )
    if args.json:
        output.print_json(rows)
        return 0
    now = _now(args)
    print(
        output.table(
            ["ID", "WHEN", "STATE", "CLASS", "MACHINE", Col("SUMMARY", flexible=True, min_width=12)],
            [
                [
                    str(i.incident_id),
                    output.when(i.create_time, now),
                    output.enum_short(ledger_pb2.IncidentState, i.state, "INCIDENT_STATE_"),
                    i.failure_class,
                    i.machine_id[:8] or "-",
                    i.summary,
                ]
                for i in rows
            ],
        )
    )
    return 0


def quarantines(args: argparse.Namespace) -> int:
    stub = _reaper(args)
    if args.action == "clear":
        if args.id is None:
            raise SystemExit("gpufleet: quarantines clear needs a quarantine id")
        grpcclient.call(
            stub.ClearQuarantine,
            reaper_service_pb2.ClearQuarantineRequest(quarantine_id=args.id, request_id=str(uuid.uuid4())),
            timeout=TIMEOUT_S,
            idempotent=True,
        )
        print(f"quarantine {args.id} cleared")
        return 0
    rows = pages(
        stub.ListQuarantines, reaper_service_pb2.ListQuarantinesRequest(page_size=200), "quarantines"
    )
    if args.json:
        output.print_json(rows)
        return 0
    now = _now(args)
    print(
        output.table(
            [
                "ID",
                "KIND",
                "OFFERING",
                "PROVIDER",
                "REGION",
                "SINCE",
                "UNTIL",
                Col("REASON", flexible=True, min_width=12),
            ],
            [
                [
                    str(q.quarantine_id),
                    output.enum_short(ledger_pb2.QuarantineKind, q.kind, "QUARANTINE_KIND_"),
                    q.offering_id or "-",
                    q.provider or "-",
                    q.region or "-",
                    output.when(q.create_time, now),
                    output.when(q.expire_time, now) if q.HasField("expire_time") else "cleared by a human",
                    q.reason,
                ]
                for q in rows
            ],
        )
    )
    return 0


def orphans(args: argparse.Namespace) -> int:
    stub = _sweeper(args)
    if args.sweep_now:
        sweep = grpcclient.call(
            stub.RunSweep,
            sweeper_service_pb2.RunSweepRequest(
                request_id=f"cli-{uuid.uuid4()}", kind=sweeper_service_pb2.SWEEP_KIND_ORPHAN_SWEEP
            ),
            timeout=60.0,
            idempotent=True,
        )
        if not args.json:
            print(
                f"sweep {sweep.sweep_id}: {sweep.instances_seen} instances listed, {sweep.orphans_seen} "
                f"orphan(s), {sweep.orphans_destroyed} destroyed. {sweep.summary}"
            )
    rows = pages(stub.ListOrphans, sweeper_service_pb2.ListOrphansRequest(page_size=200), "orphans")
    if args.json:
        output.print_json(rows)
        return 0
    now = _now(args)
    if not rows:
        print("no orphans seen: every instance labelled with this deployment has a machine record here")
        return 0
    print(
        output.table(
            ["INSTANCE", "PROVIDER", "MACHINE LABEL", "LAUNCHED", "FIRST SEEN", "DESTROYED", "ACTION"],
            [
                [
                    o.provider_instance_id,
                    output.enum_short(machine_pb2.Provider, o.provider, "PROVIDER_"),
                    o.machine_label[:8] or "-",
                    output.when(o.launch_time, now),
                    output.when(o.first_seen_time, now),
                    output.when(o.destroy_time, now),
                    o.action,
                ]
                for o in rows
            ],
        )
    )
    return 0


def add_parsers(sub: Any, client: Any) -> None:
    """Register the operator commands on the main parser (``client`` adds --json etc.)."""

    def with_reaper(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--reaper", default=None, help=addresses.flag_help("reaper"))
        return p

    w = with_reaper(client("watchdogs", "every watchdog with its cadence, last run and counts"))
    w.set_defaults(func=lambda a: run_client(watchdogs, a, "reaper"))

    led = with_reaper(client("ledger", "the failure ledger, newest first"))
    led.add_argument("--machine", default=None)
    led.add_argument("--class", dest="failure_class", default=None)
    led.add_argument("--detector", default=None)
    led.add_argument("--limit", type=int, default=50)
    led.set_defaults(func=lambda a: run_client(ledger, a, "reaper"))

    inc = with_reaper(client("incidents", "incidents; `incidents ack ID` acknowledges one"))
    inc.add_argument("action", nargs="?", choices=["list", "ack"], default="list")
    inc.add_argument("id", nargs="?", type=int, default=None)
    inc.add_argument("--open", action="store_true", help="only open incidents")
    inc.add_argument("--by", default=os.environ.get("USER", "operator"), help="who acknowledges")
    inc.set_defaults(func=lambda a: run_client(incidents, a, "reaper"))

    q = with_reaper(client("quarantines", "quarantined offerings and halted regions; `clear ID`"))
    q.add_argument("action", nargs="?", choices=["list", "clear"], default="list")
    q.add_argument("id", nargs="?", type=int, default=None)
    q.set_defaults(func=lambda a: run_client(quarantines, a, "reaper"))

    o = client("orphans", "what the orphan sweeps saw and did")
    o.add_argument("--sweeper", default=None, help=addresses.flag_help("sweeper"))
    o.add_argument("--sweep-now", action="store_true", help="run an orphan sweep now, then list")
    o.set_defaults(func=lambda a: run_client(orphans, a, "sweeper"))
