"""What the control plane does when a machine's heartbeat reports its GPUs' health.

The agent decides what a finding means (its severity table, ``gpufleet.agent.gpu_health``);
here the reported health is stored on the machine row, and a finding reported for the
first time is acted on:

- a **warning** is counted (``gpufleet.gpu.findings``) and logged; nothing else moves;
- a **critical** finding cordons the machine at once (no new work is routed to it), and a
  ``gpu_fault`` ledger row routes to REPLACE_MACHINE: its live attempts end as *our*
  failure — uncharged, their jobs requeued on the patient budget — through the ledger's
  one replacement path (:func:`gpufleet.common.ledger.record_and_apply`; the job
  lifecycle decides how a ``gpu_fault`` ends an attempt, ``ledger.replace_cause``);
- the same fault (kind and Xid) on ``repeat_count`` machines of one offering within
  ``repeat_window`` writes ``gpu_fault_repeated``, which routes to the ledger's quarantine
  of the offering (STOP_HARDWARE_CONFIG): the scale step buys elsewhere.

A finding already stored for the machine is not acted on again (a heartbeat repeats the
agent's whole report every time); a finding the control plane declines to act on is
written to the ledger too, with why. :func:`decide` is pure; :func:`apply` writes, in the
heartbeat's transaction.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.common import gpu_health
from gpufleet.common.db import models
from gpufleet.common.db.when_committed import when_committed
from gpufleet.common.ledger import FailureClass, OutcomeTarget, record_and_apply, record_failure
from gpufleet.common.metrics.catalog import GPU_FINDINGS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.outcome_policy import OutcomePolicy
from gpufleet.common.violations import AT_ONCE, Violations
from gpufleet.v1 import machine_pb2

log = logging.getLogger(__name__)

DETECTOR = "gpu_health"
MAX_FINDINGS = 32
_KINDS = frozenset(
    {
        "xid",
        "ecc_uncorrectable",
        "ecc_correctable",
        "retired_pages_pending",
        "row_remap_pending",
        "row_remap_failure",
        "gpu_lost",
        "init_failed",
    }
)


@dataclass(frozen=True)
class GpuFaultPolicy:
    """Scheduler settings ``GPUFLEET_GPU_FAULT_REPEAT_*``."""

    repeat_window: timedelta = timedelta(hours=24)
    # Machines of one offering with the same fault within the window that quarantine it.
    repeat_count: int = 2


def validate(health: machine_pb2.GpuHealth, found: Violations = AT_ONCE) -> None:
    """A heartbeat's health, checked before anything is written; each violation names its
    field (every one, into ``found``)."""
    if (
        health.state not in gpu_health.STATE_NAMES
        and health.state != machine_pb2.GPU_HEALTH_STATE_UNSPECIFIED
    ):
        found.add("gpu_health.state", f"unknown GPU health state {health.state}", "UNKNOWN_VALUE")
    if len(health.findings) > MAX_FINDINGS:
        found.add("gpu_health.findings", f"at most {MAX_FINDINGS} findings", "TOO_MANY")
        return
    for i, finding in enumerate(health.findings):
        where = f"gpu_health.findings[{i}]"
        if not 1 <= len(finding.kind) <= 64:
            found.add(f"{where}.kind", "must be 1-64 characters", "INVALID_FORMAT")
        if finding.severity not in gpu_health.SEVERITY_NAMES:
            found.add(f"{where}.severity", "must be WARNING or CRITICAL", "UNKNOWN_VALUE")
        if len(finding.message) > 500:
            found.add(f"{where}.message", "at most 500 characters", "TOO_LONG")
        if finding.gpu_index < -1:
            found.add(f"{where}.gpu_index", "must be a GPU index or -1", "OUT_OF_RANGE")
        if finding.count < 0:
            found.add(f"{where}.count", "must not be negative", "OUT_OF_RANGE")


@dataclass(frozen=True)
class HealthActions:
    """What one report means for one machine."""

    state: str
    findings: list[dict[str, Any]]
    new_warnings: list[dict[str, Any]]
    new_critical: list[dict[str, Any]]


def decide(stored: list[dict[str, Any]] | None, health: machine_pb2.GpuHealth) -> HealthActions:
    """Store what was reported; act on the findings not stored before. A finding once
    stored stays (an Xid is an event: the agent keeps it, and so does the row)."""
    reported = gpu_health.findings_from_proto(health)
    known = {gpu_health.finding_key(f) for f in stored or []}
    fresh = [f for f in reported if gpu_health.finding_key(f) not in known]
    # An ECC count may cross from a warning to critical under one key: act on the change.
    upgraded = [
        f
        for f in reported
        if f["severity"] == "critical"
        and any(
            gpu_health.finding_key(f) == gpu_health.finding_key(s) and s["severity"] != "critical"
            for s in stored or []
        )
    ]
    kept = {gpu_health.finding_key(f): f for f in stored or []}
    kept.update({gpu_health.finding_key(f): f for f in reported})
    return HealthActions(
        state=gpu_health.STATE_NAMES.get(health.state, "ok"),
        findings=list(kept.values())[:MAX_FINDINGS],
        new_warnings=[f for f in fresh if f["severity"] == "warning"],
        new_critical=[f for f in fresh if f["severity"] == "critical"] + upgraded,
    )


def _fault_name(finding: dict[str, Any]) -> str:
    """The fault as compared across machines: its kind, and the Xid number for an Xid."""
    return f"xid {finding['code']}" if finding["kind"] == "xid" else str(finding["kind"])


def _describe(finding: dict[str, Any]) -> str:
    """``[xid 79] GPU 0: ...`` — the bracketed name is what a repeat is found by."""
    where = "the machine" if finding["gpu_index"] < 0 else f"GPU {finding['gpu_index']}"
    return f"[{_fault_name(finding)}] {where}: {finding['message']}"


def apply(
    session: Session,
    machine: models.Machine,
    health: machine_pb2.GpuHealth,
    now: datetime,
    *,
    policy: GpuFaultPolicy,
    outcomes: OutcomePolicy,
    instruments: Instruments = PROCESS,
) -> HealthActions | None:
    """Store ``health`` on ``machine`` and act on what is new, in the caller's transaction.
    None when nothing was reported (an agent from before GPU health, or no watcher yet)."""
    if health.state == machine_pb2.GPU_HEALTH_STATE_UNSPECIFIED:
        return None
    actions = decide(machine.gpu_findings, health)
    machine.gpu_health = actions.state
    machine.gpu_findings = actions.findings
    machine.gpu_health_at = health.read_time.ToDatetime(tzinfo=UTC) if health.HasField("read_time") else now
    counter = instruments.counter(GPU_FINDINGS)
    for finding in actions.new_warnings + actions.new_critical:
        kind = finding["kind"] if finding["kind"] in _KINDS else "other"
        when_committed(
            session, functools.partial(counter.add, 1, {"severity": finding["severity"], "finding": kind})
        )
    for finding in actions.new_warnings:
        log.warning(
            "machine %s: GPU warning: %s",
            machine.id,
            _describe(finding),
            extra={"fields": {"machine_id": machine.id, "gpu_finding": finding["kind"]}},
        )
    if actions.new_critical:
        _critical(session, machine, actions.new_critical, now, policy, outcomes, instruments)
    return actions


def _critical(
    session: Session,
    machine: models.Machine,
    findings: list[dict[str, Any]],
    now: datetime,
    policy: GpuFaultPolicy,
    outcomes: OutcomePolicy,
    instruments: Instruments,
) -> None:
    what = "; ".join(_describe(f) for f in findings)
    log.error(
        "machine %s: critical GPU fault, cordoned and replaced: %s",
        machine.id,
        what,
        extra={"fields": {"machine_id": machine.id}},
    )
    # The cordon is FleetService.CordonMachine's own write: nothing new is routed here.
    machine.cordoned = True
    _, applied = record_and_apply(
        session,
        now,
        FailureClass.GPU_FAULT.value,
        DETECTOR,
        machine_id=machine.id,
        details=f"cordoned; {what}"[:2000],
        policy=outcomes,
        instruments=instruments,
    )
    log.info(
        "machine %s: %d attempt(s) ended as our failure, uncharged and requeued",
        machine.id,
        len(applied.lost_attempts),
    )
    for finding in findings:
        _maybe_quarantine(session, machine, finding, now, policy, outcomes, instruments)


def _maybe_quarantine(
    session: Session,
    machine: models.Machine,
    finding: dict[str, Any],
    now: datetime,
    policy: GpuFaultPolicy,
    outcomes: OutcomePolicy,
    instruments: Instruments,
) -> None:
    """The same fault on ``repeat_count`` machines of one offering within the window
    quarantines the offering; a machine of no offering (a registered box) has none to
    quarantine, and the ledger says so."""
    fault = _fault_name(finding)
    window_h = policy.repeat_window.total_seconds() / 3600
    if not machine.offering_id:
        if _repeats(session, machine, fault, now, policy) >= policy.repeat_count:
            record_failure(
                session,
                now,
                FailureClass.GPU_FAULT_REPEATED.value,
                DETECTOR,
                machine_id=machine.id,
                details=f"refused: [{fault}] repeated on a machine of no offering; nothing to quarantine",
                instruments=instruments,
            )
        return
    seen = _repeats(session, machine, fault, now, policy)
    if seen < policy.repeat_count:
        return
    record_and_apply(
        session,
        now,
        FailureClass.GPU_FAULT_REPEATED.value,
        DETECTOR,
        machine_id=machine.id,
        details=f"[{fault}] on {seen} machines of offering {machine.offering_id} within {window_h:g} h",
        policy=outcomes,
        target=OutcomeTarget(offering_id=machine.offering_id),
        instruments=instruments,
    )
    log.error(
        "offering %s quarantined: %s on %d machines within %g h",
        machine.offering_id,
        fault,
        seen,
        window_h,
        extra={"fields": {"offering_id": machine.offering_id}},
    )


def _repeats(
    session: Session, machine: models.Machine, fault: str, now: datetime, policy: GpuFaultPolicy
) -> int:
    """Machines of this one's offering (or this machine alone, with none) whose gpu_fault
    rows within the window name ``fault`` — this machine's row, just written, included."""
    same = (
        models.Machine.offering_id == machine.offering_id
        if machine.offering_id
        else models.Machine.id == machine.id
    )
    count = session.execute(
        select(func.count(func.distinct(models.Failure.machine_id)))
        .join(models.Machine, models.Machine.id == models.Failure.machine_id)
        .where(
            models.Failure.failure_class == FailureClass.GPU_FAULT.value,
            models.Failure.at >= now - policy.repeat_window,
            models.Failure.details.contains(f"[{fault}]", autoescape=True),
            same,
        )
    ).scalar_one()
    return int(count)
