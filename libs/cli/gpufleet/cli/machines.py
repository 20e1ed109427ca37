"""``gpufleet machines``: the fleet's machines over FleetService — list, one in detail, and
the operator's actions on one: cordon, uncordon, drain, deregister. A machine is named by
its id or any unique prefix of it."""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpufleet.cli import ids, outcomes, output, watching
from gpufleet.cli.client import FAILED, fail, fleet_stub, pages, run_client, system_now, unary
from gpufleet.cli.jobs import watching_flags
from gpufleet.cli.output import Col, say
from gpufleet.v1 import fleet_service_pb2, fleet_service_pb2_grpc, machine_pb2

ACTIONS = ("cordon", "uncordon", "drain", "deregister")
# States in which nothing runs on a machine, whatever its slots last said.
_AT_REST = frozenset(
    {
        machine_pb2.MACHINE_STATE_STOPPING,
        machine_pb2.MACHINE_STATE_STOPPED,
        machine_pb2.MACHINE_STATE_DESTROYING,
        machine_pb2.MACHINE_STATE_DESTROYED,
    }
)

DRAIN_HELP = (
    "drain ID: cordon the machine (nothing new is routed to it), then wait until none of its "
    "slots is busy — its running jobs finish, none is cut off — showing how many still run. "
    "It stays cordoned afterwards (`machines uncordon ID` gives it work again; idle, its "
    "timers stop it like any idle machine). Ctrl-C stops the wait, not the drain. "
    "This is not the DRAINING state a film's drain shows."
)


def state_name(state: int) -> str:
    return output.enum_short(machine_pb2.MachineState, state, "MACHINE_STATE_")


def list_machines(args: argparse.Namespace, include_destroyed: bool) -> list[machine_pb2.Machine]:
    return pages(
        fleet_stub(args).ListMachines,
        fleet_service_pb2.ListMachinesRequest(page_size=200, include_destroyed=include_destroyed),
        "machines",
    )


def resolve_machine(args: argparse.Namespace, prefix: str) -> str:
    listed: dict[str, machine_pb2.Machine] = {}

    def every_id() -> list[str]:
        listed.update({m.machine_id: m for m in list_machines(args, include_destroyed=True)})
        return list(listed)

    def describe(machine_id: str) -> str:
        m = listed[machine_id]
        return f"{machine_id}  {state_name(m.state)}  {m.pool}"

    (found,) = ids.resolve_all([prefix], every_id, "machine", describe)
    if isinstance(found, ids.IdError):
        raise found
    return found


def machines(args: argparse.Namespace) -> int:
    if args.machine in ACTIONS:
        if not args.target:
            return fail(f"machines {args.machine} needs a machine id (or a unique prefix)")
        machine_id = resolve_machine(args, args.target)
        act: Callable[[argparse.Namespace, str], int] = {
            "cordon": cordon,
            "uncordon": uncordon,
            "drain": drain,
            "deregister": deregister,
        }[args.machine]
        return act(args, machine_id)
    if args.target:
        return fail(f"unexpected argument {args.target!r} (an action first: {', '.join(ACTIONS)})")
    if args.machine:
        return machine(args, resolve_machine(args, args.machine))
    if args.json:
        if args.watch:
            return fail("--watch is a view for a person; a script polls `gpufleet machines --json`")
        output.print_json(list_machines(args, args.all))
        return 0
    if args.watch:
        return watching.watch(
            lambda: machines_table(list_machines(args, args.all), system_now(args)),
            args.interval,
            lambda: system_now(args),
        )
    print(machines_table(list_machines(args, args.all), system_now(args)))
    return 0


def flags(m: machine_pb2.Machine) -> str:
    named = (
        ("lost", m.lost),
        ("cordoned", m.cordoned),
        ("registered", m.origin == machine_pb2.MACHINE_ORIGIN_REGISTERED),
    )
    return ",".join(f for f, on in named if on) or "-"


def health(m: machine_pb2.Machine) -> str:
    """The GPUs' health as the worker last reported it: ``-`` never reported, else the state
    and, when something was found, the worst finding (``critical:xid79``)."""
    if m.gpu_health.state == machine_pb2.GPU_HEALTH_STATE_UNSPECIFIED:
        return "-"
    state = output.enum_short(machine_pb2.GpuHealthState, m.gpu_health.state, "GPU_HEALTH_STATE_").lower()
    if not m.gpu_health.findings:
        return state
    worst = m.gpu_health.findings[0]  # the agent sends the worst first
    return f"{state}:{worst.kind.replace('_', '-')}{worst.code if worst.kind == 'xid' else ''}"


def health_detail(m: machine_pb2.Machine, now: datetime) -> str:
    if m.gpu_health.state == machine_pb2.GPU_HEALTH_STATE_UNSPECIFIED:
        return "- (never reported)"
    state = output.enum_short(machine_pb2.GpuHealthState, m.gpu_health.state, "GPU_HEALTH_STATE_").lower()
    found = "; ".join(
        f"{output.enum_short(machine_pb2.GpuFindingSeverity, f.severity, 'GPU_FINDING_SEVERITY_').lower()} "
        f"{f.kind} {f.code}" + (f" on GPU {f.gpu_index}" if f.gpu_index >= 0 else "") + f": {f.message}"
        for f in m.gpu_health.findings
    )
    return f"{state}, read {output.when(m.gpu_health.read_time, now)}" + (f" — {found}" if found else "")


def machines_table(rows: list[machine_pb2.Machine], now: datetime) -> str:
    return output.table(
        [
            "MACHINE",
            Col("POOL", flexible=True, min_width=12),
            Col("OFFERING", flexible=True),
            "STATE",
            Col("BY", optional=True),
            Col("INTENT", optional=True),
            "SLOTS",
            "HEALTH",
            Col("WORKER", optional=True),
            Col("PROBE", optional=True),
            Col("PROVIDER", optional=True),
            Col("STOP DUE", optional=True),
            Col("DESTROY DUE", optional=True),
            Col("FOR FILM", optional=True),
            "FLAGS",
        ],
        [
            [
                m.machine_id[:8],
                m.pool,
                m.offering.offering_id or m.offering.instance_type,
                state_name(m.state),
                m.state_changed_by or "-",
                output.enum_short(machine_pb2.MachineIntent, m.intent, "MACHINE_INTENT_"),
                f"{m.slots_busy}/{m.slots_total}",
                health(m),
                output.when(m.liveness.worker_report_at, now),
                output.when(m.liveness.probe_ok_at, now),
                output.when(m.liveness.provider_seen_at, now),
                output.when(m.idle_timers.stop_due_at, now),
                output.when(m.idle_timers.destroy_due_at, now),
                m.earmarked_for_job[:8] or "-",
                flags(m),
            ]
            for m in rows
        ],
    )


def machine(args: argparse.Namespace, machine_id: str) -> int:
    """One machine (``GetMachine``)."""
    m = unary(fleet_stub(args).GetMachine, fleet_service_pb2.GetMachineRequest(machine_id=machine_id))
    if args.json:
        output.print_json(m)
    else:
        print(machine_detail(m, system_now(args)))
    return 0


def machine_detail(m: machine_pb2.Machine, now: datetime) -> str:
    state = state_name(m.state)
    intent = output.enum_short(machine_pb2.MachineIntent, m.intent, "MACHINE_INTENT_")
    changed = f"{output.when(m.state_changed_at, now)} by {m.state_changed_by or '?'}" + (
        f": {m.state_reason}" if m.state_reason else ""
    )
    live = m.liveness
    return output.fields(
        [
            ("machine", m.machine_id),
            (
                "pool",
                f"{m.pool or '-'}, offering {m.offering.offering_id or m.offering.instance_type or '-'}",
            ),
            ("state", f"{state}, intent {intent}" + (", cordoned" if m.cordoned else "")),
            ("changed", changed),
            ("slots", f"{m.slots_busy}/{m.slots_total} busy"),
            ("gpu health", health_detail(m, now)),
            (
                "held for",
                f"film {m.earmarked_for_job} since {output.when(m.earmarked_at, now)}"
                if m.earmarked_for_job
                else "-",
            ),
            (
                "liveness",
                f"worker {output.when(live.worker_report_at, now)}, "
                f"probe {output.when(live.probe_ok_at, now)}, "
                f"provider {output.when(live.provider_seen_at, now)}",
            ),
            (
                "idle timers",
                f"stop {output.when(m.idle_timers.stop_due_at, now)}, "
                f"destroy {output.when(m.idle_timers.destroy_due_at, now)}",
            ),
        ]
    )


def _answer(args: argparse.Namespace, m: machine_pb2.Machine, text: str) -> int:
    if args.json:
        output.print_json(m)
    else:
        print(text)
    return 0


def cordon(args: argparse.Namespace, machine_id: str) -> int:
    m = unary(fleet_stub(args).CordonMachine, fleet_service_pb2.CordonMachineRequest(machine_id=machine_id))
    return _answer(
        args,
        m,
        f"machine {machine_id} cordoned: nothing new is routed to it; its {m.slots_busy} running "
        "job(s) go on",
    )


def uncordon(args: argparse.Namespace, machine_id: str) -> int:
    m = unary(
        fleet_stub(args).UncordonMachine, fleet_service_pb2.UncordonMachineRequest(machine_id=machine_id)
    )
    return _answer(args, m, f"machine {machine_id} uncordoned: it takes jobs again")


def deregister(args: argparse.Namespace, machine_id: str) -> int:
    """A self-registered box leaves the fleet."""
    gone = unary(
        fleet_stub(args).DeregisterMachine, fleet_service_pb2.DeregisterMachineRequest(machine_id=machine_id)
    )
    return _answer(
        args, gone, f"machine {gone.machine_id} deregistered: it is no longer listed, counted or given jobs"
    )


def busy(m: machine_pb2.Machine) -> bool:
    return m.slots_busy > 0 and m.state not in _AT_REST


def drain(args: argparse.Namespace, machine_id: str) -> int:
    stub: fleet_service_pb2_grpc.FleetServiceStub = fleet_stub(args)
    m = unary(stub.CordonMachine, fleet_service_pb2.CordonMachineRequest(machine_id=machine_id))
    short = machine_id[:8]
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    pause = threading.Event()
    try:
        with watching.progress(f"machine {short} cordoned: nothing new is routed to it") as show:
            while busy(m):
                show(f"draining machine {short}: {m.slots_busy} of {m.slots_total} slot(s) still busy")
                if deadline is not None and time.monotonic() >= deadline:
                    say(
                        f"machine {short}: {m.slots_busy} slot(s) still busy after {args.timeout:g}s; "
                        "it stays cordoned"
                    )
                    return FAILED
                pause.wait(args.interval)
                m = unary(stub.GetMachine, fleet_service_pb2.GetMachineRequest(machine_id=machine_id))
    except KeyboardInterrupt:
        say(f"stopped waiting: machine {short} stays cordoned, {m.slots_busy} slot(s) busy")
        return outcomes.STOPPED_WAITING
    return _answer(
        args,
        m,
        f"machine {machine_id} drained: no job runs on it, and it stays cordoned "
        f"(`gpufleet machines uncordon {short}` gives it work again)",
    )


def add_parsers(client: Any) -> None:
    machines_ = client("machines", "list machines, show one, or cordon | uncordon | drain | deregister one")
    machines_.epilog = (
        "cordon ID: nothing new is routed to it, its running jobs go on. uncordon ID: it takes "
        f"jobs again. {DRAIN_HELP} deregister ID: a self-registered box leaves the fleet."
    )
    machines_.add_argument(
        "machine",
        nargs="?",
        default=None,
        help=f"a machine id or unique prefix, or an action: {', '.join(ACTIONS)}",
    )
    machines_.add_argument(
        "target", nargs="?", default=None, help="with an action: the machine's id or prefix"
    )
    machines_.add_argument("--all", action="store_true", help="include destroyed machines")
    machines_.add_argument(
        "--timeout", type=float, default=None, help="drain: give up waiting after this many seconds (exit 1)"
    )
    watching_flags(machines_)
    machines_.set_defaults(func=lambda a: run_client(machines, a))
