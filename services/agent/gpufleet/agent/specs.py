"""What travels through the state directory: a job's spec and an attempt's result.

Both are plain JSON documents, so the job (which may be anything, in any language) reads
its spec with no gpufleet code, and a result survives any process dying after writing it.
Tenant values are data inside the spec: they never reach a command line or a shell.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpufleet.agent.statedir import atomic_write_json, read_json
from gpufleet.v1 import job_pb2


class Outcome(StrEnum):
    """How an attempt ended on this machine; the names of ``AttemptState`` it reports."""

    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # the job's own code failed (charged)
    INFRA_ERROR = "INFRA_ERROR"  # our side failed (never charged)
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"

    def to_proto(self) -> job_pb2.AttemptState:
        return getattr(job_pb2.AttemptState, f"ATTEMPT_STATE_{self.value}")  # type: ignore[no-any-return]


@dataclass(frozen=True)
class JobSpec:
    """One attempt of one job on one slot, as the job and its runner see it."""

    attempt_id: str
    job_id: str
    slot: int
    slots: int = 1
    kind: str = ""
    pipeline_version: str = ""
    workspace: str = ""
    request_id: str = ""
    tenant_values: dict[str, str] = field(default_factory=dict)
    # Clock seconds from the job's start; 0 means no limit.
    time_limit_s: float = 0.0
    # The kind runs only the platform's code: filtered outbound access (else no network).
    outbound_network: bool = False
    # The kind's limits for the job's cgroup; 0: the machine's defaults.
    memory_limit_bytes: int = 0
    pids_limit: int = 0
    # The kind resumes from checkpoints: the job gets a checkpoint folder that is sent to
    # the control plane while it runs; and the checkpoint it starts from ("" for none).
    keeps_checkpoint: bool = False
    checkpoint_id: str = ""
    checkpoint_sha256: str = ""
    checkpoint_size_bytes: int = 0
    # The attempt's job tokens by scope ("model", "voice"): laid out as files in the job's
    # folder (GPUFLEET_TOKENS_DIR) and redacted from its log.
    tokens: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> JobSpec:
        return cls(
            attempt_id=str(doc["attempt_id"]),
            job_id=str(doc["job_id"]),
            slot=int(doc["slot"]),
            slots=int(doc.get("slots", 1)),
            kind=str(doc.get("kind", "")),
            pipeline_version=str(doc.get("pipeline_version", "")),
            workspace=str(doc.get("workspace", "")),
            request_id=str(doc.get("request_id", "")),
            tenant_values={str(k): str(v) for k, v in dict(doc.get("tenant_values", {})).items()},
            time_limit_s=float(doc.get("time_limit_s", 0.0)),
            outbound_network=bool(doc.get("outbound_network", False)),
            memory_limit_bytes=int(doc.get("memory_limit_bytes", 0)),
            pids_limit=int(doc.get("pids_limit", 0)),
            keeps_checkpoint=bool(doc.get("keeps_checkpoint", False)),
            checkpoint_id=str(doc.get("checkpoint_id", "")),
            checkpoint_sha256=str(doc.get("checkpoint_sha256", "")),
            checkpoint_size_bytes=int(doc.get("checkpoint_size_bytes", 0)),
            tokens={str(k): str(v) for k, v in dict(doc.get("tokens", {})).items()},
        )

    def save(self, path: Path) -> None:
        atomic_write_json(path, self.to_json())

    @classmethod
    def load(cls, path: Path) -> JobSpec:
        doc = read_json(path)
        if not isinstance(doc, dict):
            raise FileNotFoundError(f"no job spec at {path}")
        return cls.from_json(doc)

    def occupies(self) -> range:
        """The slots this attempt holds (a film holds every slot of its machine)."""
        return range(self.slot, self.slot + self.slots)


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt ended: what the worker reports to the scheduler, idempotently."""

    attempt_id: str
    outcome: Outcome
    exit_code: int = 0
    # Clock seconds the job ran, times the slots it held: what the attempt is charged for.
    slot_seconds: float = 0.0
    message: str = ""
    start_time: str = ""
    end_time: str = ""
    # INFRA_ERROR because the slot's walls could not be built: the job never started.
    slot_not_closed: bool = False
    # INFRA_ERROR because the platform stopped a job running well (the lease fence, the
    # runner told to stop, an announced platform kill): not the job's doing.
    disrupted: bool = False

    def save(self, path: Path) -> None:
        doc = asdict(self)
        doc["outcome"] = self.outcome.value
        atomic_write_json(path, doc)

    @classmethod
    def load(cls, path: Path) -> AttemptResult | None:
        doc = read_json(path)
        if not isinstance(doc, dict):
            return None
        return cls(
            attempt_id=str(doc["attempt_id"]),
            outcome=Outcome(doc["outcome"]),
            exit_code=int(doc.get("exit_code", 0)),
            slot_seconds=float(doc.get("slot_seconds", 0.0)),
            message=str(doc.get("message", "")),
            start_time=str(doc.get("start_time", "")),
            end_time=str(doc.get("end_time", "")),
            slot_not_closed=bool(doc.get("slot_not_closed", False)),
            disrupted=bool(doc.get("disrupted", False)),
        )


def iso(value: datetime) -> str:
    return value.isoformat()
