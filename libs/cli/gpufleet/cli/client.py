"""What every command that talks to a running system shares: its stubs, paged listing, the
system's clock, and one way to turn a failure into one clear line that names the address
it tried."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpufleet.cli import credentials
from gpufleet.cli.ids import IdError
from gpufleet.common import grpcclient
from gpufleet.common.errors import GpufleetError, Unavailable
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_service_pb2_grpc,
    workspace_service_pb2_grpc,
)

TIMEOUT_S = 10.0
# Exit status of a command that could not do what it was asked (the server refused, no
# such id, nothing answers at the address). argparse's own is 2.
FAILED = 1


def job_stub(args: argparse.Namespace) -> job_service_pb2_grpc.JobServiceStub:
    return job_service_pb2_grpc.JobServiceStub(credentials.channel(args, args.scheduler, Role.SCHEDULER))


def fleet_stub(args: argparse.Namespace) -> fleet_service_pb2_grpc.FleetServiceStub:
    return fleet_service_pb2_grpc.FleetServiceStub(credentials.channel(args, args.scheduler, Role.SCHEDULER))


def workspace_stub(args: argparse.Namespace) -> workspace_service_pb2_grpc.WorkspaceServiceStub:
    return workspace_service_pb2_grpc.WorkspaceServiceStub(
        credentials.channel(args, args.scheduler, Role.SCHEDULER)
    )


def unary(method: Callable[..., Any], request: Any, timeout: float = TIMEOUT_S) -> Any:
    """One call with a deadline; a read or an idempotent write, retried on a transport
    failure (every call the CLI makes is one or the other)."""
    return grpcclient.call(method, request, timeout=timeout, idempotent=True)


def system_now(args: argparse.Namespace) -> datetime:
    """The system's own time (FleetService.GetSystemTime), what ages are counted against;
    this machine's clock only when the scheduler cannot say (an older one, or a backend
    certificate that may not ask)."""
    now = getattr(args, "now", None)
    if isinstance(now, datetime):  # the demo's
        return now
    try:
        reply = grpcclient.call(
            fleet_stub(args).GetSystemTime,
            fleet_service_pb2.GetSystemTimeRequest(),
            timeout=5.0,
            idempotent=True,
        )
    except GpufleetError:
        return datetime.now(UTC)
    return reply.now.ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


def pages(method: Any, request: Any, field: str, limit: int | None = None) -> list[Any]:
    """Every item of a paged List (or the first ``limit``), following next_page_token."""
    items: list[Any] = []
    while True:
        resp = unary(method, request)
        items.extend(getattr(resp, field))
        if not resp.next_page_token or (limit is not None and len(items) >= limit):
            return items[:limit] if limit is not None else items
        request.page_token = resp.next_page_token


def fail(message: str) -> int:
    print(f"gpufleet: {message}", file=sys.stderr)
    return FAILED


def explain(exc: GpufleetError, service: str, address: str) -> str:
    """One line (two when nothing answers) for a failed call."""
    where = f" (field {exc.field})" if exc.field and exc.field not in exc.message else ""
    text = f"{exc.message}{where}"
    if isinstance(exc, Unavailable):
        text = (
            f"the {service} at {address} did not answer: {exc.message}\n"
            f"gpufleet: is the system running there? Start it with `gpufleet up`, or pass --{service}."
        )
    return text


def run_client(
    func: Callable[[argparse.Namespace], int], args: argparse.Namespace, service: str = "scheduler"
) -> int:
    """Run a client command that talks to ``service`` (its address in ``args.<service>``); a
    gRPC error or an id that names nothing becomes one clear line and exit status 1."""
    try:
        return int(func(args))
    except GpufleetError as exc:
        return fail(explain(exc, service, getattr(args, service, "?")))
    except IdError as exc:
        return fail(str(exc))
