"""The soak's figures at the end, from three sources that must agree: the store (jobs,
attempts, the failure ledger, machines), the machines' own process tables (the sampler),
and the provider's truth (the local driver's folders and processes).

- ``jobs_lost``: a job the scheduler accepted that is not in the store, or that ended
  anything but SUCCEEDED (every soak job renders and exits 0: any other end is ours).
- ``jobs_run_twice``: jobs with two attempts' processes alive in one sample.
- ``healthy_destroys``: machines replaced by a net (a ledger row routed REPLACE_MACHINE)
  that no machine fault touched and that were not created or started in a window of
  provider faults.
- ``instances_billing_unrecorded``: local instances with a live process whose machine the
  store does not hold, or holds as DESTROYED.
- ``late_detections``: machine faults past a threshold that no net acted on (a ledger row
  on the machine, or the machine stopped or destroyed) within threshold plus one cadence.
  A fault for the nets that watch machines in service (machine lost, went silent) on a
  machine the store did not hold in service at the fault (still booting: the chaos aims
  by the provider's truth) is not judged: ``detections_not_judged_not_in_service``.
- ``wrong_charges``: charged attempts whose charge is not the scheduler's own
  ``attempt_charge_micros``, attempts that ended by our failure and were charged, and jobs
  whose total is not the sum of their attempts'.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from benchmarks.soak_parts.chaos import MACHINE_FAULTS, Fault, Thresholds
from benchmarks.soak_parts.job_processes import JobProcessSampler
from benchmarks.soak_parts.machine_watch import IN_SERVICE, OUT_OF_SERVICE, MachineWatch
from gpufleet.common.db import models
from gpufleet.common.job_writer import attempt_charge_micros

# Attempts that end by our doing when the job itself always succeeds.
OUR_FAILURES = frozenset({"LOST", "INFRA_ERROR", "FAILED", "TIMED_OUT"})
# What the nets that watch machines in service must do (see ``not_in_service``).
IN_SERVICE_EXPECTS = frozenset({"machine_lost", "went_silent"})


@dataclass
class Verdict:
    figures: dict[str, Any] = field(default_factory=dict)
    details: dict[str, list[str]] = field(default_factory=dict)

    def note(self, key: str, line: str) -> None:
        self.details.setdefault(key, []).append(line)


def ts(value: datetime | None) -> float:
    return value.timestamp() if value is not None else float("inf")


def judge(
    session: Session,
    submitted: Iterable[str],
    sampler: JobProcessSampler,
    faults: list[Fault],
    thresholds: Thresholds,
    machines_root: Path,
    virtual_end: float,
    speed: float,
    watch: MachineWatch,
    slack_virtual_s: float,
) -> Verdict:
    v = Verdict()
    ids = set(submitted)
    jobs = {j.id: j for j in session.scalars(select(models.Job).where(models.Job.id.in_(ids)))}
    attempts = list(session.scalars(select(models.Attempt).where(models.Attempt.job_id.in_(ids))))
    machines = {m.id: m for m in session.scalars(select(models.Machine))}
    plans = {w.id: session.get_one(models.Plan, w.plan_id) for w in session.scalars(select(models.Workspace))}
    failures = list(session.scalars(select(models.Failure).order_by(models.Failure.id)))

    # ---- jobs ------------------------------------------------------------------------
    lost = 0
    for job_id in sorted(ids - jobs.keys()):
        lost += 1
        v.note("jobs_lost", f"{job_id}: accepted, not in the store")
    states: dict[str, int] = {}
    for job in jobs.values():
        states[job.state] = states.get(job.state, 0) + 1
        if job.state in ("FAILED", "TIMED_OUT", "CANCELLED"):
            lost += 1
            v.note("jobs_lost", f"{job.id} ({job.kind_id}) ended {job.state}: {job.status_message[:200]}")
    v.figures["jobs_lost"] = lost
    v.figures["jobs_by_state"] = states
    v.figures["jobs_completed"] = states.get("SUCCEEDED", 0)
    v.figures["jobs_unfinished"] = sum(
        n for s, n in states.items() if s in ("QUEUED", "DISPATCHING", "RUNNING")
    )

    # ---- run twice -------------------------------------------------------------------
    twice = sorted({o.job_id for o in sampler.overlaps})
    for job_id in twice:
        first = next(o for o in sampler.overlaps if o.job_id == job_id)
        span = sum(1 for o in sampler.overlaps if o.job_id == job_id)
        v.note(
            "jobs_run_twice",
            f"{job_id}: attempts {', '.join(first.attempts)} alive together in {span} sample(s)",
        )
    v.figures["jobs_run_twice"] = len(twice)
    # The sampler is only as good as what it sees: every attempt that succeeded ran for
    # seconds, so each must have been seen alive in the process table at least once.
    unseen = sorted(a.id for a in attempts if a.state == "SUCCEEDED" and a.id not in sampler.seen)
    v.figures["succeeded_attempts_unseen_by_sampler"] = len(unseen)
    v.figures["attempts_seen_in_process_tables"] = len(sampler.seen)
    for a_id in unseen:
        v.note("succeeded_attempts_unseen_by_sampler", f"attempt {a_id}")

    # ---- charges ---------------------------------------------------------------------
    wrong = 0
    by_job: dict[str, int] = {}
    attempt_states: dict[str, int] = {}
    for a in attempts:
        attempt_states[a.state] = attempt_states.get(a.state, 0) + 1
        by_job[a.job_id] = by_job.get(a.job_id, 0) + a.charge_micros
        if a.state in ("STARTING", "RUNNING"):
            continue
        job = jobs[a.job_id]
        if a.state in OUR_FAILURES:
            line = f"{a.id} on {a.machine_id[:8]} {a.state}: {a.status_message[:160]}"
            v.note("attempts_ended_ours (info)", line)
        if a.state in OUR_FAILURES and (a.charged or a.charge_micros):
            wrong += 1
            v.note(
                "wrong_charges", f"attempt {a.id} ended {a.state} (ours) and was charged {a.charge_micros}"
            )
        elif a.charged:
            expected = attempt_charge_micros(a.slot_seconds, machines[a.machine_id], plans[job.workspace_id])
            if expected != a.charge_micros:
                wrong += 1
                v.note(
                    "wrong_charges",
                    f"attempt {a.id}: charged {a.charge_micros}, its slot-seconds make {expected}",
                )
    for job in jobs.values():
        if job.charge_micros != by_job.get(job.id, 0):
            wrong += 1
            v.note(
                "wrong_charges",
                f"job {job.id}: total {job.charge_micros} != its attempts' {by_job.get(job.id, 0)}",
            )
    v.figures["wrong_charges"] = wrong
    v.figures["attempts_by_state"] = attempt_states

    # ---- healthy destroys -----------------------------------------------------------
    touched = {f.machine_id for f in faults if f.cls in MACHINE_FAULTS and f.machine_id}
    windows = [
        (f.virtual_at, f.virtual_at + f.duration_s * speed) for f in faults if f.cls == "provider_faults"
    ]
    healthy = set()
    for row in failures:
        if row.outcome != "REPLACE_MACHINE" or not row.machine_id or row.machine_id in touched:
            continue
        m = machines.get(row.machine_id)
        born = ts(m.requested_at) if m is not None else float("inf")
        if any(lo - 60 <= born <= hi + 60 for lo, hi in windows):
            continue  # created while the provider misbehaved: not a healthy machine
        if row.machine_id not in healthy:
            healthy.add(row.machine_id)
            v.note(
                "healthy_destroys",
                f"machine {row.machine_id}: {row.failure_class} by {row.detector}: {row.details[:200]}",
            )
    v.figures["healthy_destroys"] = len(healthy)

    # ---- detections ------------------------------------------------------------------
    judge_detections(v, faults, thresholds, machines, failures, watch, virtual_end, slack_virtual_s)

    # ---- the provider's truth ---------------------------------------------------------
    unrecorded = 0
    groups = _live_process_groups()
    for record_path in sorted(machines_root.glob("*/instance.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(record_path.read_text())
            machine_id = record_path.parent.name
            alive = record.get("pgid") in groups
            m = machines.get(machine_id)
            if alive and (m is None or m.state == "DESTROYED"):
                unrecorded += 1
                v.note(
                    "instances_billing_unrecorded",
                    f"{record['provider_instance_id']} ({machine_id}): alive, the store holds "
                    f"{'nothing' if m is None else 'it as DESTROYED'}",
                )
    v.figures["instances_billing_unrecorded"] = unrecorded
    live_attempts = {a.id for a in attempts if a.state in ("STARTING", "RUNNING")}
    strays = sorted(a for a in sampler.last_alive if a not in live_attempts)
    v.figures["job_processes_of_ended_attempts_at_end"] = len(strays)
    for attempt_id in strays:
        v.note(
            "job_processes_of_ended_attempts_at_end",
            f"attempt {attempt_id} of job {sampler.attempt_job[attempt_id]}",
        )
    return v


def not_in_service(expect: str, at_fault: tuple[str, bool, bool] | None) -> str | None:
    """Why a fault that expects ``expect`` is not judged as a detection, given its machine's
    (state, lost, cordoned) in the store at the fault's time (``MachineWatch.state_at``);
    None when it is judged.

    The lost and went-silent nets watch machines in service (READY or DRAINING); a machine
    still provisioning, booting or starting is the boot nets', whose deadlines are far
    longer, so a fault the chaos aimed at it (from the provider's truth, which says
    RUNNING as soon as the process is up) is no test of those nets. A machine already
    acted on (lost, cordoned, stopping or gone) stays judged: ``MachineWatch.acted_at``
    says it was acted on at the fault's own time."""
    if expect not in IN_SERVICE_EXPECTS:
        return None
    if at_fault is None:
        return "not yet read in the store"
    state, lost, cordoned = at_fault
    if lost or cordoned or state in OUT_OF_SERVICE or state in IN_SERVICE:
        return None
    return state


def judge_detections(
    v: Verdict,
    faults: list[Fault],
    thresholds: Thresholds,
    machines: Mapping[str, Any],
    failures: Sequence[Any],
    watch: MachineWatch,
    virtual_end: float,
    slack_virtual_s: float,
) -> None:
    """``late_detections`` and its companions, from the faults, the store's machines (by id)
    and failure ledger rows, and the watch's history; no database."""
    late = judged = not_judged = not_in_service_n = 0
    delays: dict[str, list[float]] = {}
    for f in faults:
        if not f.expect:
            continue
        why = not_in_service(f.expect, watch.state_at(f.machine_id, f.virtual_at))
        if why is not None:
            not_in_service_n += 1
            v.note(
                "detections_not_judged_not_in_service (info)",
                f"{f.cls} on {f.machine_id} ({f.duration_s:.1f} s real): expected {f.expect}, but the "
                f"machine was {why} at the fault, not in service",
            )
            continue
        deadline = f.virtual_at + f.deadline_virtual_s
        m = machines.get(f.machine_id)
        if f.expect == "went_silent" and m is not None and m.first_observed_at is not None:
            grace_end = ts(m.first_observed_at) + thresholds.went_silent_grace_s
            deadline = max(deadline, grace_end + thresholds.went_silent_every_s)
        if deadline > virtual_end:
            not_judged += 1
            continue
        judged += 1
        deadline += slack_virtual_s
        rows = [ts(r.at) for r in failures if r.machine_id == f.machine_id and ts(r.at) >= f.virtual_at]
        watched = watch.acted_at(f.machine_id, f.virtual_at)
        acted = min([*rows, *([watched] if watched is not None else [])], default=float("inf"))
        if acted > deadline:
            late += 1
            seen = "never" if acted == float("inf") else f"after {acted - f.virtual_at:.0f} s"
            v.note(
                "late_detections",
                f"{f.cls} on {f.machine_id} ({f.duration_s:.1f} s real): expected {f.expect} within "
                f"{deadline - f.virtual_at:.0f} s, acted on {seen}",
            )
        else:
            delays.setdefault(f.cls, []).append(acted - f.virtual_at)
    v.figures["late_detections"] = late
    v.figures["detections_judged"] = judged
    v.figures["detections_not_judged_run_ended"] = not_judged
    v.figures["detections_not_judged_not_in_service"] = not_in_service_n
    v.figures["detection_delay_max_s"] = {k: round(max(d), 1) for k, d in delays.items()}


def _live_process_groups() -> set[int]:
    groups = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = (proc / "stat").read_text().rsplit(")", 1)[-1].split()
                if fields[0] != "Z":
                    groups.add(int(fields[2]))
    return groups
