"""A machine's GPU health as the control plane keeps it: the stored shape on the machine
row (``gpu_health``, ``gpu_findings``, ``gpu_health_at``) and its wire form
(``gpufleet.v1.GpuHealth``), both ways. What a finding *means* is decided on the agent
(``gpufleet.agent.gpu_health``, the severity table); what the control plane *does* about
it is ``gpufleet.scheduler.gpu_faults``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.v1 import machine_pb2

STATE_NAMES = {
    machine_pb2.GPU_HEALTH_STATE_UNMONITORED: "unmonitored",
    machine_pb2.GPU_HEALTH_STATE_OK: "ok",
    machine_pb2.GPU_HEALTH_STATE_WARNING: "warning",
    machine_pb2.GPU_HEALTH_STATE_CRITICAL: "critical",
}
_STATE_VALUES = {name: value for value, name in STATE_NAMES.items()}
SEVERITY_NAMES = {
    machine_pb2.GPU_FINDING_SEVERITY_WARNING: "warning",
    machine_pb2.GPU_FINDING_SEVERITY_CRITICAL: "critical",
}
_SEVERITY_VALUES = {name: value for value, name in SEVERITY_NAMES.items()}
_NO_SEVERITY = machine_pb2.GPU_FINDING_SEVERITY_UNSPECIFIED


def finding_key(finding: dict[str, Any]) -> tuple[str, int, int]:
    """One finding per kind and GPU (and Xid number): how a repeat is told from a new one.
    An ECC count that grows is the same finding."""
    code = int(finding["code"]) if finding["kind"] == "xid" else 0
    return (str(finding["kind"]), int(finding["gpu_index"]), code)


def _iso(stamp: Timestamp) -> str | None:
    return stamp.ToDatetime().isoformat() + "Z" if stamp.seconds or stamp.nanos else None


def findings_from_proto(health: machine_pb2.GpuHealth) -> list[dict[str, Any]]:
    """The findings as stored (JSON), from a validated message."""
    return [
        {
            "kind": f.kind,
            "severity": SEVERITY_NAMES[f.severity],
            "gpu_index": f.gpu_index,
            "code": f.code,
            "message": f.message,
            "first_seen": _iso(f.first_seen_time),
            "count": max(1, f.count),
        }
        for f in health.findings
    ]


def _timestamp(value: str | datetime | None) -> Timestamp | None:
    if value is None:
        return None
    at = datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) else value
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def to_proto(
    state: str | None, findings: list[dict[str, Any]] | None, read_at: datetime | None
) -> machine_pb2.GpuHealth:
    """The stored health as the API shows it (state UNSPECIFIED: never reported)."""
    if state is None:
        return machine_pb2.GpuHealth()
    message = machine_pb2.GpuHealth(
        state=_STATE_VALUES.get(state, machine_pb2.GPU_HEALTH_STATE_UNSPECIFIED),
        findings=[
            machine_pb2.GpuFinding(
                kind=str(f["kind"]),
                severity=_SEVERITY_VALUES.get(
                    str(f["severity"]), machine_pb2.GPU_FINDING_SEVERITY_UNSPECIFIED
                ),
                gpu_index=int(f["gpu_index"]),
                code=int(f["code"]),
                message=str(f.get("message", "")),
                first_seen_time=_timestamp(f.get("first_seen")),
                count=int(f.get("count", 1)),
            )
            for f in findings or []
        ],
    )
    read = _timestamp(read_at)
    if read is not None:
        message.read_time.CopyFrom(read)
    return message
