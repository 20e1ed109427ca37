"""The product backend's view from the command line, over WorkspaceService:

gpufleet workspaces                         every workspace: plan, active or paused
gpufleet workspaces create W --plan P       a new workspace (--paused: created paused)
gpufleet workspaces pause W... / resume W...  its queued jobs wait / start again
gpufleet workspaces set-plan W P            another plan from now on
gpufleet usage --workspace W --since 7d     slot-seconds, GPU-hours and charges, by kind and by day

A workspace is named by its whole id: it is a name a person chose, not a random id, and a
prefix of one could pause someone else's.
"""

from __future__ import annotations

import argparse
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.cli import output
from gpufleet.cli.client import fail, pages, run_client, system_now, unary, workspace_stub
from gpufleet.common.errors import GpufleetError, Unavailable
from gpufleet.v1 import catalog_pb2, workspace_service_pb2

ACTIONS = ("create", "pause", "resume", "set-plan")
_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


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
    if args.action:
        return act(args)
    rows = pages(
        workspace_stub(args).ListWorkspaces, catalog_pb2.ListWorkspacesRequest(page_size=200), "workspaces"
    )
    if args.json:
        output.print_json(rows)
        return 0
    if not rows:
        print("no workspaces yet: `gpufleet workspaces create W --plan P` makes one")
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
    report = unary(workspace_stub(args).GetUsage, request)
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


def act(args: argparse.Namespace) -> int:
    names: list[str] = args.names
    if args.action == "create":
        if len(names) != 1 or not args.plan:
            return fail("workspaces create takes one workspace id and --plan PLAN")
        return create(args, names[0])
    if args.action == "set-plan":
        if len(names) != 2:
            return fail("workspaces set-plan takes a workspace id and a plan: set-plan W PLAN")
        return update(args, [(names[0], catalog_pb2.Workspace(workspace_id=names[0], plan=names[1]))], "plan")
    if not names:
        return fail(f"workspaces {args.action} takes one or more workspace ids")
    active = args.action == "resume"
    return update(args, [(n, catalog_pb2.Workspace(workspace_id=n, active=active)) for n in names], "active")


def create(args: argparse.Namespace, workspace_id: str) -> int:
    request = workspace_service_pb2.CreateWorkspaceRequest(
        request_id=args.request_id or f"cli-{uuid.uuid4()}",
        workspace=catalog_pb2.Workspace(workspace_id=workspace_id, plan=args.plan),
        paused=args.paused,
    )
    w = unary(workspace_stub(args).CreateWorkspace, request)
    if args.json:
        output.print_json(w)
    else:
        print(f"workspace {w.workspace_id} created on plan {w.plan}, {_state(w)}")
    return 0


def update(args: argparse.Namespace, changes: list[tuple[str, catalog_pb2.Workspace]], field: str) -> int:
    """UpdateWorkspace for each (idempotent by its nature: pausing a paused workspace again
    answers it as it is). Exit 1 if any was refused; the others are changed all the same."""
    stub = workspace_stub(args)
    status = 0
    done = []
    for name, workspace in changes:
        request = workspace_service_pb2.UpdateWorkspaceRequest(workspace=workspace, update_mask=[field])
        try:
            w = unary(stub.UpdateWorkspace, request)
        except Unavailable:
            raise  # said once, with the address tried
        except GpufleetError as exc:
            status = fail(f"workspace {name}: {exc.message}")
            continue
        done.append(w)
        if not args.json:
            print(f"workspace {w.workspace_id}: plan {w.plan}, {_state(w)}")
    if args.json:
        output.print_json(done)
    return status


def _state(w: catalog_pb2.Workspace) -> str:
    return "active" if w.active else "paused (its queued jobs wait; its running ones finish)"


def add_parsers(client: Any) -> None:
    ws = client("workspaces", "list the workspaces, or create | pause | resume | set-plan")
    ws.epilog = (
        "create W --plan P [--paused]: a new workspace (idempotent by --request-id). "
        "pause W...: its queued jobs wait, its running ones finish. resume W...: its jobs start "
        "again. set-plan W P: its plan from now on. Workspaces are named by their whole id."
    )
    ws.add_argument("action", nargs="?", choices=ACTIONS, default=None, help="what to do (default: list)")
    ws.add_argument("names", nargs="*", metavar="ARG", help="workspace id(s); set-plan: W PLAN")
    ws.add_argument("--plan", default=None, help="create: the workspace's plan")
    ws.add_argument("--paused", action="store_true", help="create: make it paused")
    ws.add_argument("--request-id", default=None, help="create: idempotency key (default: a new one)")
    ws.set_defaults(func=lambda a: run_client(workspaces, a))
    use = client("usage", "what a workspace used and was charged, by kind and by day")
    use.add_argument("--workspace", required=True)
    use.add_argument("--since", required=True, help="e.g. 7d, 24h, or 2026-12-01")
    use.add_argument("--until", default=None, help="default: now")
    use.set_defaults(func=lambda a: run_client(usage, a))
