"""The soak with chaos (issue #27 item 6): the whole system for N minutes under random,
seeded faults, then a check from the store, the machines' process tables and the provider's
truth that nothing was lost, run twice, destroyed while healthy, left billing, caught late
or charged wrong.

    .venv/bin/python benchmarks/soak.py --minutes 60 [--speed 10] [--seed 1]

Not a test (the default test run has a tiny version: tests/benchmarks/test_soak_smoke.py).
It starts its own PostgreSQL (tests/support/postgres.py), then the stack of ``gpufleet up``
(libs/cli's Stack: every service its own process, local machines) on it at ``--speed``, and:

- a supervisor that restarts a control-plane service that exited (as Kubernetes would),
  counting exits the chaos did not cause apart, and restarts a killed agent daemon after a
  few seconds (as systemd would on a machine);
- a steady arrival of short episodes and films for four workspaces of the default catalogue
  (two of them created through the API), through the client library ``gpufleet.client``;
- a chaos driver (benchmarks/soak_parts/chaos.py) killing agents, workers, runners and
  control-plane services, pausing agents, cutting probe paths (a TCP proxy in front of
  every agent, put there by the local driver's FAULT INJECTION hook), making the provider
  fail, slow down and lose answers, and restarting PostgreSQL; the GPU-fault class is
  listed and skipped with its reason until the GPU-health work lands;
- a 2 Hz sampler of every job process on the host (benchmarks/soak_parts/job_processes.py).

**Speed.** 10 by default: every threshold stays far above what real processes take here.
The tightest settings the chaos crosses are the attempt lease (90 s -> 9 s real), the
worker's freshness (60 s -> 6 s) and the lost detector (180 s -> 18 s, cadence 6 s), while
a Python service or agent restarts in 1-3 s real on this loaded 2-core host and the
agents' gRPC deadlines are real seconds (5 s). At 60x the lease would be 1.5 s real,
shorter than one restart, and the nets would fire on the host's slowness, not on faults.

Once judged, it ends everything it started (benchmarks/soak_parts/teardown.py: the
services, then every process of every machine boot), and looks for any process still
pointing into its state folder: each is killed and named, and counted in
``processes_left_after_teardown``.

It prints a line a minute, then a table and the details of every non-zero figure, and last
one JSON line. Exit status 1 when a zero-figure is not zero or the self-check fails (the
soak did not do the work it reports: too few jobs completed, an enabled class never
injected, no process samples; or a process outlived the teardown).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import func, select

from benchmarks.soak_parts.arrivals import Arrivals
from benchmarks.soak_parts.chaos import (
    FAKE_NVML_STATE,
    FAULT_CLASSES,
    Chaos,
    Thresholds,
    gpu_faults_available,
)
from benchmarks.soak_parts.job_processes import JobProcessSampler
from benchmarks.soak_parts.machine_watch import MachineWatch
from benchmarks.soak_parts.probe_proxy import ProbeProxies
from benchmarks.soak_parts.supervisor import Supervisor
from benchmarks.soak_parts.teardown import MachineGroups, end_machines, leftovers
from benchmarks.soak_parts.verdict import judge
from gpufleet.agent.settings import Settings as AgentSettings
from gpufleet.cli.credentials import tls_dir
from gpufleet.cli.stack import SERVICES, Stack, StackConfig, free_port
from gpufleet.client import Client
from gpufleet.common.clock import ScaledClock
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles
from gpufleet.reaper.settings import Settings as ReaperSettings
from tests.support.nvml_fake import FAKE_NVML_DIR, STATE_ENV, FakeGpus
from tests.support.postgres import start_postgres

ZERO_FIGURES = (
    "jobs_lost",
    "jobs_run_twice",
    "healthy_destroys",
    "instances_billing_unrecorded",
    "late_detections",
    "wrong_charges",
)
# Real seconds a net may take beyond its threshold plus cadence before it counts as late: the
# host's own scheduling delay (2 cores shared with other work), said beside the figures.
SLACK_REAL_S = 2.0
AGENT_UNIT = Path(__file__).resolve().parent / "soak_parts" / "agent_unit.py"
# Two of the default catalogue's workspaces, and one more of each plan made through the API.
EXTRA_WORKSPACES = (("soak-studio", "studio"), ("soak-creator", "creator"))


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True, help="minutes of chaos (wall time)")
    p.add_argument("--speed", type=float, default=10.0, help="the control plane's clock speed (default 10)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--arrival-s", type=float, default=12.0, help="mean real seconds between two submits")
    p.add_argument("--gap-s", type=float, nargs=2, default=(10.0, 30.0), help="real seconds between faults")
    p.add_argument(
        "--drain-s", type=float, default=120.0, help="at most this long for jobs to end after the chaos"
    )
    p.add_argument(
        "--classes",
        default=",".join(FAULT_CLASSES),
        help=f"fault classes to inject (default all: {','.join(FAULT_CLASSES)})",
    )
    p.add_argument("--min-completed", type=int, default=None, help="self-check floor (default 0.75 a minute)")
    p.add_argument(
        "--min-per-class", type=int, default=1, help="self-check: each enabled class at least this often"
    )
    p.add_argument(
        "--warm-up-s",
        type=float,
        default=60.0,
        help="at most this long for a first job to start before the chaos",
    )
    p.add_argument("--keep", action="store_true", help="keep the state folder and say where")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    enabled = tuple(c.strip() for c in args.classes.split(",") if c.strip())
    unknown = sorted(set(enabled) - set(FAULT_CLASSES))
    if unknown:
        print(f"soak: unknown fault class(es): {', '.join(unknown)}", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    # A server a test kills must not lose acknowledged commits to its own settings.
    durable = "durable_commits" in inspect.signature(start_postgres).parameters
    postgres = start_postgres(durable_commits=True) if durable else start_postgres()
    postgres.psql("CREATE DATABASE soak")
    state = Path(tempfile.mkdtemp(prefix="gf-soak-"))
    machines_root = state / "machines"
    machines_root.mkdir()
    ports = {name: free_port() for name in SERVICES}
    stack = Stack(
        StackConfig(
            state_dir=state,
            ports=ports,
            clock_speed=args.speed,
            external_database_url=postgres.url("soak"),
            overrides={
                "provisioner": {
                    "local_agent_base_port": "0",
                    # systemd's stand-in inside each machine: a killed agent comes back.
                    "local_agent_command": json.dumps([sys.executable, str(AGENT_UNIT)]),
                }
            },
        )
    )
    gpus = "gpu_fault" in enabled and not gpu_faults_available()
    if gpus:
        # Every agent imports the fake NVML and reads its machine's own file: the path is
        # relative to the agent's working directory, its machine folder.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(FAKE_NVML_DIR), os.environ.get("PYTHONPATH")) if p
        )
        os.environ[STATE_ENV] = FAKE_NVML_STATE

    def new_machine(folder: Path) -> None:
        if gpus and not (folder / FAKE_NVML_STATE).exists():
            FakeGpus(folder / FAKE_NVML_STATE)  # one idle, healthy GPU

    proxies = ProbeProxies(machines_root, on_machine=new_machine)
    supervisor = Supervisor(stack, machines_root)
    groups = MachineGroups(machines_root)  # every machine boot's process group, for the teardown
    reaper = ReaperSettings()
    agent = AgentSettings(machine_id="soak")
    thresholds = Thresholds(
        lost_after_s=reaper.lost_after_s,
        lost_every_s=reaper.lost_detector_every_s,
        probe_every_s=reaper.idle_scan_every_s,
        went_silent_after_s=reaper.went_silent_after_s,
        went_silent_every_s=reaper.went_silent_every_s,
        went_silent_grace_s=reaper.went_silent_grace_s,
        heartbeat_s=agent.heartbeat_s,
        gpu_poll_real_s=agent.gpu_health_poll_s,
    )
    status = 1
    chaos: Chaos | None = None
    torn_down = False

    def teardown() -> list[str]:
        """End everything the soak started but PostgreSQL, in an order where nothing can
        start anything again behind it: the chaos and the supervisor (which restarts
        services), the services (the provisioner starts machines), every machine's
        processes, the stack's folder; then the processes still alive that are the soak's
        (named, and killed)."""
        nonlocal torn_down
        torn_down = True
        for step in (
            *([chaos.stop] if chaos is not None else []),
            supervisor.stop,
            groups.stop,
            stack.stop,
            lambda: end_machines(machines_root, groups.groups),
            stack.shutdown,
        ):
            try:
                step()
            except Exception as exc:  # the next steps must still run
                print(f"soak: teardown: {exc!r}", file=sys.stderr, flush=True)
        left = leftovers(state, groups.groups)
        print(f"soak: processes left after teardown: {len(left)}", flush=True)
        for line in left:
            print(f"soak: left after teardown (killed): {line}", flush=True)
        return left

    try:
        chaos = Chaos(
            rng=rng,
            stack=stack,
            supervisor=supervisor,
            proxies=proxies,
            postgres=postgres,
            machines_root=machines_root,
            speed=args.speed,
            virtual_now=lambda: 0.0,
            thresholds=thresholds,
            gap_s=tuple(args.gap_s),
            enabled=enabled,  # type: ignore[arg-type]
        )
        chaos.enable_probe_proxies()  # before the first machine: every agent behind its proxy
        proxies.start()
        groups.start()
        t0 = time.time()
        stack.start()
        clock = ScaledClock(args.speed, stack.config.clock_origin)
        chaos.virtual_now = lambda: clock.now().timestamp()
        print(
            f"soak: stack up on PostgreSQL in {time.time() - t0:.1f} s at speed {args.speed:g}, "
            f"seed {args.seed}, {args.minutes:g} min of chaos; state in {state}",
            flush=True,
        )
        for cls, why in sorted(chaos.unavailable.items()):
            if cls in enabled:
                print(f"soak: {cls}: not available yet: {why}", flush=True)
        client = backend_client(stack)
        for workspace, plan in EXTRA_WORKSPACES:
            client.create_workspace(workspace, plan)
        arrivals = Arrivals(
            client,
            random.Random(args.seed + 1),
            ["acme-studio", "indie-creator", *[w for w, _ in EXTRA_WORKSPACES]],
            every_s=args.arrival_s,
        )
        sampler = JobProcessSampler(ours=arrivals.ours)
        sessions = make_sessionmaker(make_engine(stack.config.database_url))
        watch = MachineWatch(sessions, chaos.virtual_now)
        watch.start()
        supervisor.start()
        sampler.start()
        arrivals.start()
        # The chaos begins once the fleet has started a job (or after a minute): faults on a
        # fleet that never served anything would prove nothing.
        warm_until = time.time() + args.warm_up_s
        while time.time() < warm_until and not started_one(sessions, list(arrivals.jobs)):
            time.sleep(1.0)
        chaos.start()
        began = time.time()
        end = began + args.minutes * 60
        next_line = began + 60
        try:
            while time.time() < end:
                time.sleep(min(1.0, max(0.0, end - time.time())))
                if time.time() >= next_line:
                    next_line += 60
                    progress(began, arrivals, chaos, supervisor, sampler, sessions)
        except KeyboardInterrupt:  # Ctrl-C ends the chaos early; the run is still judged
            print("soak: interrupted — ending the chaos now and judging what ran", flush=True)
        chaos_minutes = (time.time() - began) / 60
        print(f"soak: chaos over after {chaos_minutes:.1f} min — every fault healed; draining", flush=True)
        chaos.stop()
        arrivals.stop()
        drain_until = time.time() + args.drain_s
        while time.time() < drain_until and unfinished(sessions, list(arrivals.jobs)) > 0:
            time.sleep(2.0)
        sampler.stop()
        sampler.sample()
        watch.stop()
        watch.read()
        virtual_end = clock.now().timestamp()
        with sessions() as session:
            verdict = judge(
                session,
                list(arrivals.jobs),
                sampler,
                chaos.faults,
                thresholds,
                machines_root,
                virtual_end,
                args.speed,
                watch,
                SLACK_REAL_S * args.speed,
            )
        figures = verdict.figures
        faults_file = state / "faults.json"
        faults_file.write_text(json.dumps([dataclasses.asdict(f) for f in chaos.faults], indent=1))
        where = f"{faults_file} (kept with --keep or a failure)"
        verdict.note("faults log (info)", f"every fault, its target and times: {where}")
        injected: dict[str, int] = {c: 0 for c in enabled if c not in chaos.unavailable}
        for f in chaos.faults:
            injected[f.cls] = injected.get(f.cls, 0) + 1
        injected.update(chaos.provider_injected())
        figures.update(
            {
                "faults_injected": injected,
                "faults_not_available": {c: w for c, w in chaos.unavailable.items() if c in enabled},
                "jobs_submitted": len(arrivals.jobs),
                "submit_retries": arrivals.submit_retries,
                "submit_slowest_s": round(arrivals.slowest_s, 1),
                "machine_reads": watch.reads,
                "service_restarts_after_chaos": supervisor.service_restarts,
                "unexpected_service_exits": len(supervisor.unexpected_exits),
                "agents_back_after_kill": sum("agent back" in f.detail for f in chaos.faults),
                "process_samples": sampler.samples,
                "minutes": round(chaos_minutes, 1),
                "speed": args.speed,
                "seed": args.seed,
            }
        )
        for name, code, tail in supervisor.unexpected_exits:
            last = [line for line in tail.splitlines() if line.strip()][-3:]
            verdict.note("unexpected_service_exits", f"{name} exited {code}: {' | '.join(last)[:600]}")
        # Judged: the machines and services are ended now, so the report can say whether
        # anything outlived them.
        left = teardown()
        figures["processes_left_after_teardown"] = len(left)
        for line in left:
            verdict.note("processes_left_after_teardown", line)
        problems = self_check(args, figures, injected, chaos)
        if left:
            problems.append(f"processes left after teardown: {len(left)} (killed now)")
        figures["self_check"] = "ok" if not problems else "failed"
        figures["problems"] = problems
        report(figures, verdict.details)
        status = 0 if not problems and all(figures[k] == 0 for k in ZERO_FIGURES) else 1
        print(json.dumps(figures, sort_keys=True), flush=True)
        return status
    finally:
        if not torn_down:
            teardown()  # the run failed or was interrupted: still nothing may outlive it
        postgres.stop()
        if args.keep or status != 0:
            print(f"soak: state folder kept: {state}", file=sys.stderr)
        else:
            shutil.rmtree(state, ignore_errors=True)


def backend_client(stack: Stack) -> Client:
    """A product backend's client, with a backend certificate of the stack's CA."""
    folder = stack.config.state_dir / "backend"
    folder.mkdir(mode=0o700)
    authority = Authority.open(tls_dir(stack.config.state_dir))
    authority.issue(
        Identity(Role.BACKEND, authority.deployment),
        TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key"),
    )
    return Client(stack.config.address("scheduler"), folder, timeout=10.0)


def started_one(sessions: Any, job_ids: list[str]) -> bool:
    try:
        with sessions() as session:
            return bool(
                session.scalar(
                    select(func.count()).select_from(models.Attempt).where(models.Attempt.job_id.in_(job_ids))
                )
            )
    except Exception:
        return False


def unfinished(sessions: Any, job_ids: list[str]) -> int:
    try:
        with sessions() as session:
            return int(
                session.scalar(
                    select(func.count())
                    .select_from(models.Job)
                    .where(
                        models.Job.id.in_(job_ids), models.Job.state.in_(("QUEUED", "DISPATCHING", "RUNNING"))
                    )
                )
                or 0
            )
    except Exception:  # the database may be starting again: ask later
        return 1


def progress(
    began: float,
    arrivals: Arrivals,
    chaos: Chaos,
    supervisor: Supervisor,
    sampler: JobProcessSampler,
    sessions: Any,
) -> None:
    states: dict[str, int] = {}
    try:
        with sessions() as session:
            for state, n in session.execute(
                select(models.Job.state, func.count())
                .where(models.Job.id.in_(list(arrivals.jobs)))
                .group_by(models.Job.state)
            ):
                states[state] = n
    except Exception as exc:  # PostgreSQL may be down right now
        states = {"(store unreadable)": 0}
        del exc
    by_class: dict[str, int] = {}
    for f in chaos.faults:
        by_class[f.cls] = by_class.get(f.cls, 0) + 1
    print(
        f"soak: {int((time.time() - began) / 60)} min: submitted {len(arrivals.jobs)}, jobs {states}, "
        f"faults {sum(by_class.values())} {by_class}, service restarts {supervisor.service_restarts}, "
        f"unexpected exits {len(supervisor.unexpected_exits)}, run-twice samples {len(sampler.overlaps)}",
        flush=True,
    )


def self_check(
    args: argparse.Namespace, figures: dict[str, Any], injected: dict[str, int], chaos: Chaos
) -> list[str]:
    problems = []
    floor = args.min_completed if args.min_completed is not None else max(1, int(args.minutes * 0.75))
    if figures["jobs_completed"] < floor:
        problems.append(f"only {figures['jobs_completed']} job(s) completed (floor {floor})")
    for cls in FAULT_CLASSES:
        if (
            cls in chaos.enabled
            and cls not in chaos.unavailable
            and injected.get(cls, 0) < args.min_per_class
        ):
            problems.append(f"{cls} injected {injected.get(cls, 0)} time(s) (at least {args.min_per_class})")
    if "provider_faults" in injected and not any(
        k.startswith("provider_") and k != "provider_faults" and v for k, v in injected.items()
    ):
        problems.append("no provider call was failed, slowed or lost in any window")
    if figures["process_samples"] < args.minutes * 60:
        problems.append(f"only {figures['process_samples']} process samples")
    unseen = figures["succeeded_attempts_unseen_by_sampler"]
    if unseen:
        problems.append(f"{unseen} succeeded attempt(s) never seen in a process table: the sampler is blind")
    if figures["jobs_submitted"] == 0:
        problems.append("no job was submitted")
    return problems


def report(figures: dict[str, Any], details: dict[str, list[str]]) -> None:
    rows = [
        *[(k, figures[k]) for k in ZERO_FIGURES],
        (
            "jobs submitted / completed / unfinished",
            f"{figures['jobs_submitted']} / {figures['jobs_completed']} / {figures['jobs_unfinished']}",
        ),
        ("jobs by state", figures["jobs_by_state"]),
        ("attempts by state", figures["attempts_by_state"]),
        (
            "detections judged / not (run ended / not in service)",
            f"{figures['detections_judged']} / {figures['detections_not_judged_run_ended']}"
            f" / {figures['detections_not_judged_not_in_service']}",
        ),
        ("slowest detection by class (s, control-plane clock)", figures["detection_delay_max_s"]),
        ("job processes of ended attempts at the end", figures["job_processes_of_ended_attempts_at_end"]),
        (
            "service restarts after chaos / unexpected exits",
            f"{figures['service_restarts_after_chaos']} / {figures['unexpected_service_exits']}",
        ),
        ("agents back after a kill (systemd stand-in)", figures["agents_back_after_kill"]),
        ("processes left after teardown", figures["processes_left_after_teardown"]),
        ("submit retries", figures["submit_retries"]),
        (
            "process samples / attempts seen in them",
            f"{figures['process_samples']} / {figures['attempts_seen_in_process_tables']}",
        ),
    ]
    print("\n  figure" + " " * 46 + "value")
    for name, value in rows:
        print(f"  {name:<52} {value}")
    print("\n  faults injected by class")
    for cls, n in sorted(figures["faults_injected"].items()):
        print(f"  {cls:<52} {n}")
    for cls, why in sorted(figures["faults_not_available"].items()):
        print(f"  {cls:<52} not available yet: {why}")
    for key, lines in sorted(details.items()):
        print(f"\n  {key}:")
        for line in lines[:20]:
            print(f"    {line}")
        if len(lines) > 20:
            print(f"    ... and {len(lines) - 20} more")
    print(
        f"\nself-check: {'ok' if not figures['problems'] else 'FAILED: ' + '; '.join(figures['problems'])}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
