"""The product backend's view from the command line, over WorkspaceService:

gpufleet workspaces                         every workspace: plan, active or paused
gpufleet usage --workspace W --since 7d     slot-seconds, GPU-hours and charges, by kind and by day
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.cli import credentials, output
from gpufleet.cli.commands import pages, run_client, system_now
from gpufleet.common import grpcclient
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import catalog_pb2, workspace_service_pb2, workspace_service_pb2_grpc

TIMEOUT_S = 10.0
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _stub(args: argparse.Namespace) -> workspace_service_pb2_grpc.WorkspaceServiceStub:
    return workspace_service_pb2_grpc.WorkspaceServiceStub(
        credentials.channel(args, args.scheduler, Role.SCHEDULER)
    )


def parse_moment(text: str, now: datetime, flag: str) -> datetime:
    """``7d``/``12h``/``30m`` before ``now``, or an ISO date or time (UTC when unzoned)."""
    relative = _RELATIVE.match(text.strip())
    if relative:
        return now - timedelta(seconds=float(relative.group(1)) * _UNITS[relative.group(2)])
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(
            f"gpufleet: {flag} {text!r} is neither a span like 7d, 12h, 30m nor a date like 2026-12-01"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def workspaces(args: argparse.Namespace) -> int:
    rows = pages(_stub(args).ListWorkspaces, catalog_pb2.ListWorkspacesRequest(page_size=200), "workspaces")
    if args.json:
        output.print_json(rows)
        return 0
    if not rows:
        print("no workspaces yet: create one with WorkspaceService.CreateWorkspace")
        return 0
    print(
        output.table(
            ["WORKSPACE", "PLAN", "STATE"],
            [[w.workspace_id, w.plan, "active" if w.active else "paused"] for w in rows],
        )
    )
    return 0


def _stamp(moment: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(moment)
    return out


def usage(args: argparse.Namespace) -> int:
    now = system_now(args)
    since = parse_moment(args.since, now, "--since")
    request = workspace_service_pb2.GetUsageRequest(workspace_id=args.workspace, start_time=_stamp(since))
    until = now
    if args.until:  # else the system's own now, an attempt that ended this moment included
        until = parse_moment(args.until, now, "--until")
        request.end_time.CopyFrom(_stamp(until))
    report = grpcclient.call(_stub(args).GetUsage, request, timeout=TIMEOUT_S, idempotent=True)
    if args.json:
        output.print_json(report)
        return 0
    print(
        f"{report.workspace_id}: {since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC "
        "(attempts that ended in the range; one not charged counts zero)"
    )

    def row(label: str, f: Any) -> list[str]:
        return [
            label,
            str(f.attempts),
            f"{f.slot_seconds:,.0f}",
            f"{f.gpu_hours:,.2f}",
            output.money(f.charge_micros),
        ]

    headers = ["", "ATTEMPTS", "SLOT-SECONDS", "GPU-HOURS", "CHARGED"]
    print()
    print(output.table(["KIND", *headers[1:]], [row(k.kind, k.figures) for k in report.by_kind]))
    print()
    print(output.table(["DAY", *headers[1:]], [row(d.day, d.figures) for d in report.by_day]))
    print()
    print(output.table(headers, [row("total", report.total)]))
    return 0


def add_parsers(client: Any) -> None:
    ws = client("workspaces", "list the workspaces: plan, active or paused")
    ws.set_defaults(func=lambda a: run_client(workspaces, a))
    use = client("usage", "what a workspace used and was charged, by kind and by day")
    use.add_argument("--workspace", required=True)
    use.add_argument("--since", required=True, help="e.g. 7d, 24h, or 2026-12-01")
    use.add_argument("--until", default=None, help="default: now")
    use.set_defaults(func=lambda a: run_client(usage, a))
