"""``gpufleet demo``: the whole system on a sped-up clock, with a scripted scenario that a
newcomer can follow: short jobs for two workspaces fill both machines the pool may hold,
then a film arrives and the machine whose jobs end soonest drains for it; jobs finish,
the machines go quiet, are stopped, then destroyed.

Everything is real — separate processes, gRPC, SQLite, a local machine (an agent process
with its worker and one runner per job) — except time, which runs ``--speed`` times faster
for every process alike.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from gpufleet.cli import ops, output
from gpufleet.cli.stack import SERVICES, PortsInUse, Stack, StackConfig, free_port
from gpufleet.cli.state_lock import StateDirInUse
from gpufleet.common import grpcclient
from gpufleet.common.clock import ScaledClock
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    machine_pb2,
)

SCENARIO = [
    # (workspace, kind, minutes of rendering, topic)
    ("acme-studio", "short_episode", 6, "volcanoes of Iceland"),
    ("indie-creator", "clip", 4, "my cat's birthday"),
    ("acme-studio", "short_episode", 5, "history of the bicycle"),
    ("indie-creator", "clip", 3, "a day at the beach"),
]
# Submitted once every short above runs: the pool is at its ceiling (two machines), so
# the machine whose jobs end soonest drains for it.
FILM = ("acme-studio", "film", 8, "the long voyage")

# Demo thresholds (virtual seconds). Defaults in production: stop after 5 min idle,
# destroy after 2 h idle; the demo keeps the stop default and shortens the destroy timer
# so the whole story fits in well under two minutes.
DEMO_OVERRIDES = {
    "scheduler": {"tick_s": "15", "attempt_lease_s": "900", "worker_fresh_s": "900"},
    "reaper": {"idle_stop_after_s": "300", "idle_destroy_after_s": "1800", "idle_sample_window_s": "0.2"},
    "provisioner": {"heartbeat_s": "30", "local_agent_base_port": "0"},
    "sweeper": {},
}


@dataclass
class Clock:
    start: float
    speed: float

    def stamp(self) -> str:
        virtual = (time.time() - self.start) * self.speed
        h, rem = divmod(int(virtual), 3600)
        m, s = divmod(rem, 60)
        return f"{h:02d}:{m:02d}:{s:02d}"


class Timeline:
    """Prints what changed since the last look, with the demo clock's time."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[str, int] = {}
        self.machines: dict[str, tuple[int, bool, bool, int]] = {}
        self.labels: dict[str, str] = {}
        # machine id -> (film job id, when it began draining, when the film started there)
        self.drains: dict[str, tuple[str, str, str]] = {}

    def say(self, text: str) -> None:
        print(f"  [{self.clock.stamp()}] {text}", flush=True)

    def job_label(self, job: job_pb2.Job) -> str:
        return self.labels.get(job.job_id, job.job_id[:8])

    def observe_jobs(self, jobs: list[job_pb2.Job]) -> None:
        for job in jobs:
            before = self.jobs.get(job.job_id)
            if before == job.state:
                continue
            self.jobs[job.job_id] = job.state
            state = output.enum_short(job_pb2.JobState, job.state, "JOB_STATE_").lower()
            extra = ""
            if job.state == job_pb2.JOB_STATE_SUCCEEDED:
                extra = (
                    f" — {job.slot_seconds / 60:.1f} slot-minutes, charged {output.money(job.charge_micros)}"
                )
            elif job.state == job_pb2.JOB_STATE_DISPATCHING and job.attempts:
                last = job.attempts[-1]
                extra = f" — attempt {len(job.attempts)} to machine {last.machine_id[:8]}, slot {last.slot}"
            elif (
                job.state not in (job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING) and job.status_message
            ):
                extra = f" — {job.status_message}"
            self.say(f"job {self.job_label(job)}: {state}{extra}")

    def observe_machines(self, machines: list[machine_pb2.Machine]) -> None:
        for m in machines:
            armed = m.idle_timers.HasField("stop_due_at")
            key = (m.state, armed, m.idle_timers.HasField("destroy_due_at"), m.slots_busy)
            before = self.machines.get(m.machine_id)
            if before == key:
                continue
            self.machines[m.machine_id] = key
            name = f"machine {m.machine_id[:8]}"
            state = output.enum_short(machine_pb2.MachineState, m.state, "MACHINE_STATE_")
            if m.state == machine_pb2.MACHINE_STATE_DRAINING and (before is None or before[0] != m.state):
                film = self.labels.get(m.earmarked_for_job, m.earmarked_for_job[:8])
                self.drains[m.machine_id] = (m.earmarked_for_job, self.clock.stamp(), "")
                self.say(
                    f"{name}: draining for film {film} — its jobs end soonest; it takes no new job "
                    "and nothing running is cut off"
                )
            elif (
                before is not None
                and before[0] == machine_pb2.MACHINE_STATE_DRAINING
                and m.state == machine_pb2.MACHINE_STATE_READY
            ):
                film_id, began, _ = self.drains.get(m.machine_id, ("", "", ""))
                self.drains[m.machine_id] = (film_id, began, self.clock.stamp())
                self.say(f"{name}: drained — film {self.labels.get(film_id, film_id[:8])} runs here alone")
            elif before is None or before[0] != m.state:
                self.say(f"{name}: {_machine_story(state, m)}")
            if (
                before is not None
                and before[3] != m.slots_busy
                and m.state == machine_pb2.MACHINE_STATE_READY
            ):
                self.say(f"{name}: {m.slots_busy} of {m.slots_total} slots busy")
            if armed and (before is None or not before[1]):
                self.say(f"{name}: quiet — idle timers armed (stop in 5 min, destroy in 30 min)")
            elif (
                not armed
                and before is not None
                and before[1]
                and m.state in (machine_pb2.MACHINE_STATE_READY, machine_pb2.MACHINE_STATE_BOOTING)
            ):
                self.say(f"{name}: traffic seen — idle timers cleared")


def _machine_story(state: str, m: machine_pb2.Machine) -> str:
    return {
        "PROVISIONING": f"requested from offering {m.offering.offering_id} ({m.offering.instance_type}, "
        f"{m.slots_total} slots, {output.money(m.offering.hourly_price_micros)}/h)",
        "BOOTING": "instance running; agent booting",
        "READY": "worker reporting — ready for jobs",
        "STOPPING": "stop timer fell due — stopping (disk kept)",
        "STOPPED": "stopped: no GPU bill, disk kept",
        "DESTROYING": "destroy timer fell due — destroying",
        "DESTROYED": "destroyed: nothing left to bill",
    }.get(state, state.lower())


def run_demo(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="gpufleet-demo-"))
    config = StackConfig(
        state_dir=state_dir,
        ports={s: free_port() for s in SERVICES},
        clock_speed=args.speed,
        overrides=DEMO_OVERRIDES,
        log_format="json",
    )
    stack = Stack(config)
    print(
        f"gpufleet demo — the whole control plane on this machine, with time running {args.speed:g}x faster."
    )
    print(f"  state and logs: {state_dir}\n")
    print("Starting the services (each its own process, talking gRPC):")
    try:
        stack.start(on_started=lambda name, addr: print(f"  - {name:<12} {addr}"))
        clock = Clock(start=config.clock_origin or time.time(), speed=args.speed)
        return _scenario(stack, clock, args)
    except (StateDirInUse, PortsInUse) as exc:
        print(f"gpufleet demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted")
        return 130
    finally:
        leftover = stack.shutdown()
        if leftover:
            print(f"  (cleaned up {leftover} local machine process group(s) still running)")


def _scenario(stack: Stack, clock: Clock, args: argparse.Namespace) -> int:
    channel = grpcclient.open_channel(stack.config.address("scheduler"), stack.transport(), Role.SCHEDULER)
    jobs_stub = job_service_pb2_grpc.JobServiceStub(channel)
    fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
    timeline = Timeline(clock)
    # The timeline counts from the first submission, not from the services' start-up.
    clock.start = time.time()
    print("\nSubmitting GPU jobs for two workspaces (the product backend's SubmitJob):")
    ids: list[str] = []

    def submit(ws: str, kind: str, minutes: int, topic: str) -> str:
        job = jobs_stub.SubmitJob(
            job_service_pb2.SubmitJobRequest(
                request_id=f"demo-{uuid.uuid4()}",
                job=job_pb2.Job(
                    workspace=ws,
                    pool="l4",
                    kind=kind,
                    pipeline_version="2026.12.0",
                    tenant_values={"topic": topic, "duration_s": str(minutes * 60)},
                ),
            ),
            timeout=10,
        )
        timeline.labels[job.job_id] = job.job_id[:8]
        ids.append(job.job_id)
        return f"{job.job_id[:8]} ({kind} for {ws}: {topic!r}, ~{minutes} min)"

    for ws, kind, minutes, topic in SCENARIO:
        print(f"  - {submit(ws, kind, minutes, topic)}")
    shorts = list(ids)
    film_sent = False
    print("\nTimeline (demo clock since the first submission, hh:mm:ss):")
    deadline = time.monotonic() + args.timeout
    destroyed_seen = False
    while time.monotonic() < deadline:
        jobs = [jobs_stub.GetJob(job_service_pb2.GetJobRequest(job_id=i), timeout=10) for i in ids]
        machines = list(
            fleet.ListMachines(
                fleet_service_pb2.ListMachinesRequest(include_destroyed=True, page_size=100), timeout=10
            ).machines
        )
        timeline.observe_jobs(jobs)
        timeline.observe_machines(machines)
        if not film_sent and all(j.state == job_pb2.JOB_STATE_RUNNING for j in jobs if j.job_id in shorts):
            film_sent = True
            timeline.say(f"every short runs on the pool's two machines; a film arrives: {submit(*FILM)}")
            continue
        all_done = film_sent and all(
            j.state
            in (
                job_pb2.JOB_STATE_SUCCEEDED,
                job_pb2.JOB_STATE_FAILED,
                job_pb2.JOB_STATE_CANCELLED,
                job_pb2.JOB_STATE_TIMED_OUT,
            )
            for j in jobs
        )
        destroyed_seen = bool(machines) and all(
            m.state == machine_pb2.MACHINE_STATE_DESTROYED for m in machines
        )
        if all_done and destroyed_seen:
            break
        failed = stack.failed()
        if failed:
            print(
                f"\ngpufleet demo: service(s) {', '.join(failed)} exited; see {stack.config.state_dir}/logs",
                file=sys.stderr,
            )
            return 1
        time.sleep(0.1)
    else:
        print(
            f"\ngpufleet demo: the scenario did not finish within {args.timeout:.0f}s; "
            f"logs in {stack.config.state_dir}/logs",
            file=sys.stderr,
        )
        return 1
    _summary(jobs, machines, stack, clock, timeline)
    ok = all(j.state == job_pb2.JOB_STATE_SUCCEEDED for j in jobs)
    return 0 if ok else 1


def _waits(jobs: list[job_pb2.Job]) -> list[list[str]]:
    """Per kind: how long its jobs waited from submission to their (last) attempt's start."""
    waited: dict[str, list[float]] = {}
    for j in jobs:
        if j.attempts:
            start = j.attempts[-1].start_time.ToDatetime()
            waited.setdefault(j.kind, []).append((start - j.create_time.ToDatetime()).total_seconds() / 60)
    return [
        [kind, str(len(w)), f"mean {sum(w) / len(w):.1f}, max {max(w):.1f}"]
        for kind, w in sorted(waited.items())
    ]


def _summary(
    jobs: list[job_pb2.Job],
    machines: list[machine_pb2.Machine],
    stack: Stack,
    clock: Clock,
    timeline: Timeline,
) -> None:
    print("\nSummary")
    by_ws: dict[str, list[job_pb2.Job]] = {}
    for j in jobs:
        by_ws.setdefault(j.workspace, []).append(j)
    rows = []
    for ws, items in sorted(by_ws.items()):
        ok = sum(1 for j in items if j.state == job_pb2.JOB_STATE_SUCCEEDED)
        rows.append(
            [
                ws,
                f"{ok}/{len(items)}",
                f"{sum(j.slot_seconds for j in items) / 60:.1f}",
                output.money(sum(j.charge_micros for j in items)),
            ]
        )
    print(output.table(["WORKSPACE", "SUCCEEDED", "SLOT-MINUTES", "CHARGED"], rows))
    print()
    print(output.table(["KIND", "JOBS", "WAITED (DEMO MIN)"], _waits(jobs)))
    for machine_id, (film_id, began, ended) in timeline.drains.items():
        print(
            f"\n  film {film_id[:8]}: machine {machine_id[:8]} drained for it from {began} to "
            f"{ended or '?'} (demo clock): its shorts finished, none was cut off, none started there "
            "meanwhile, and the film ran there alone on every slot"
        )
    print()
    for m in machines:
        life = (m.state_changed_at.ToDatetime() - m.requested_at.ToDatetime()).total_seconds()
        print(
            f"  machine {m.machine_id[:8]} ({m.offering.instance_type}): "
            f"{output.enum_short(machine_pb2.MachineState, m.state, 'MACHINE_STATE_').lower()} "
            f"{life / 60:.0f} min (demo clock) after it was requested"
        )
    # What an operator sees of the same run: `gpufleet watchdogs` and `gpufleet ledger`.
    reaper_address = stack.config.address("reaper")
    print(f"\nThe watchdogs that watched this run (`gpufleet watchdogs --reaper {reaper_address}`):")
    # Ages are shown against the system's sped-up clock, not this machine's.
    system_now = ScaledClock(clock.speed, stack.config.clock_origin or clock.start).now()
    view = argparse.Namespace(
        reaper=reaper_address,
        state_dir=stack.config.state_dir,
        json=False,
        limit=20,
        machine=None,
        failure_class=None,
        detector=None,
        now=system_now,
    )
    try:
        ops.watchdogs(view)
        print(f"\nThe failure ledger (`gpufleet ledger --reaper {reaper_address}`):")
        ops.ledger(view)
    except Exception as exc:  # the summary must not hide the scenario's result
        print(f"  unavailable ({exc})")
    print(
        f"\nDone in {clock.stamp()} of demo time. Every step above went through real gRPC between "
        "separate processes."
    )
