"""Checkpoints kept by the control plane, so that a film's progress survives the machine
that made it (seed 001: "A film resumes from its last checkpoint").

The worker on the machine sends what the job wrote to its checkpoint folder as one
archive, in parts of at most 1 MiB appended in order to an upload it names
(``PutCheckpointPart``), then commits it (``CommitCheckpoint``): the bytes are checked
against the size and SHA-256 the worker computed, moved into the store and recorded as the
job's next checkpoint; the bytes of the two newest of each job are kept (an older one's
row stays, marked discarded, so an attempt still shows what it started from). The next attempt of the job is
dispatched with the newest, and its worker reads it back (``ReadCheckpoint``) before the
job starts.

Where the bytes are kept is the store's business (:mod:`gpufleet.scheduler.checkpoint_store`):
a folder every scheduler process shares, or an S3 or GCS bucket (``GPUFLEET_CHECKPOINT_URL``),
under one contract. A checkpoint is kept in the store before its row is written and removed
after its row is deleted, so a crash leaves at worst bytes no row names, never a row whose
bytes are gone.
"""

from __future__ import annotations

import logging
import re
import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db import models
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES
from gpufleet.common.errors import FailedPrecondition, InvalidArgument, NotFound
from gpufleet.scheduler.checkpoint_store import PART_MAX_BYTES, CheckpointStore
from gpufleet.scheduler.render import checkpoint_to_proto
from gpufleet.scheduler.validation import JOB_ID, require
from gpufleet.v1 import job_pb2, worker_service_pb2

log = logging.getLogger(__name__)

UPLOAD_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")


class CheckpointService:
    """The three WorkerService calls of a checkpoint, over the store and the rows.

    Every call names its machine and attempt, and is refused unless that attempt runs on
    that machine (a part or commit: the attempt is live and its kind resumes from
    checkpoints; a read: the attempt is of the checkpoint's own job)."""

    KEEP = 2

    def __init__(self, sessions: sessionmaker[Session], clock: Clock, store: CheckpointStore) -> None:
        self.sessions = sessions
        self.clock = clock
        self.store = store

    def put_part(self, request: worker_service_pb2.PutCheckpointPartRequest) -> int:
        machine_id, attempt_id = _names(request.machine_id, request.attempt_id)
        upload_id = require(request.upload_id, "upload_id", UPLOAD_ID, "upload id (a UUID)")
        if request.offset < 0:
            raise InvalidArgument("must not be negative", field="offset")
        with self.sessions() as session:
            self._writer(session, machine_id, attempt_id)
        return self.store.append(upload_id, request.offset, request.data)

    def commit(self, request: worker_service_pb2.CommitCheckpointRequest) -> job_pb2.Checkpoint:
        machine_id, attempt_id = _names(request.machine_id, request.attempt_id)
        upload_id = require(request.upload_id, "upload_id", UPLOAD_ID, "upload id (a UUID)")
        sha = require(request.sha256, "sha256", SHA256, "lowercase hex SHA-256")
        if not 0 < request.size_bytes <= self.store.max_bytes:
            raise InvalidArgument(f"must be between 1 and {self.store.max_bytes}", field="size_bytes")
        with self.sessions() as session:
            self._writer(session, machine_id, attempt_id)
        checkpoint_id = str(uuid.uuid4())
        self.store.commit(upload_id, checkpoint_id, request.size_bytes, sha)
        now = self.clock.now()
        try:
            with self.sessions() as session, session.begin():
                attempt = self._writer(session, machine_id, attempt_id)
                newest = session.execute(
                    select(func.max(models.Checkpoint.sequence)).where(
                        models.Checkpoint.job_id == attempt.job_id
                    )
                ).scalar()
                row = models.Checkpoint(
                    id=checkpoint_id,
                    job_id=attempt.job_id,
                    attempt_id=attempt.id,
                    sequence=(newest or 0) + 1,
                    size_bytes=request.size_bytes,
                    sha256=sha,
                    created_at=now,
                )
                session.add(row)
                session.flush()
                old = list(
                    session.execute(
                        select(models.Checkpoint)
                        .where(
                            models.Checkpoint.job_id == attempt.job_id,
                            models.Checkpoint.discarded_at.is_(None),
                        )
                        .order_by(models.Checkpoint.sequence.desc())
                        .offset(self.KEEP)
                    ).scalars()
                )
                for gone in old:
                    gone.discarded_at = now
                answer = checkpoint_to_proto(row)
        except Exception:
            self.store.remove(checkpoint_id)  # no row names it: it must not be kept
            raise
        for gone in old:
            self.store.remove(gone.id)
        self.store.drop_stale_uploads()
        log.info(
            "attempt %s: checkpoint %d of job %s kept (%d bytes)",
            attempt_id,
            answer.sequence,
            answer.job_id,
            answer.size_bytes,
            extra={"fields": {"attempt_id": attempt_id, "job_id": answer.job_id}},
        )
        return answer

    def read(self, request: worker_service_pb2.ReadCheckpointRequest) -> tuple[bytes, bool]:
        machine_id, attempt_id = _names(request.machine_id, request.attempt_id)
        checkpoint_id = require(request.checkpoint_id, "checkpoint_id", UPLOAD_ID, "checkpoint id")
        if request.offset < 0:
            raise InvalidArgument("must not be negative", field="offset")
        if not 0 <= request.max_bytes <= PART_MAX_BYTES:
            raise InvalidArgument(f"must be between 0 and {PART_MAX_BYTES}", field="max_bytes")
        with self.sessions() as session:
            attempt = _attempt_on(session, machine_id, attempt_id)
            checkpoint = session.get(models.Checkpoint, checkpoint_id)
            if checkpoint is None or checkpoint.job_id != attempt.job_id:
                raise NotFound(f"no checkpoint {checkpoint_id!r} of this job", field="checkpoint_id")
            if checkpoint.discarded_at is not None:
                raise NotFound(f"checkpoint {checkpoint_id!r} is no longer kept", field="checkpoint_id")
        return self.store.read(checkpoint_id, request.offset, request.max_bytes or PART_MAX_BYTES)

    @staticmethod
    def _writer(session: Session, machine_id: str, attempt_id: str) -> models.Attempt:
        attempt = _attempt_on(session, machine_id, attempt_id)
        if attempt.state not in LIVE_ATTEMPT_STATES:
            raise FailedPrecondition(
                f"attempt {attempt_id!r} is {attempt.state}: it keeps no checkpoint", field="attempt_id"
            )
        job = session.get_one(models.Job, attempt.job_id)
        kind = session.get_one(models.JobKind, job.kind_id)
        if not kind.resumes_from_checkpoint:
            raise FailedPrecondition(f"kind {kind.id!r} does not resume from checkpoints", field="attempt_id")
        return attempt


def _names(machine_id: str, attempt_id: str) -> tuple[str, str]:
    return (
        require(machine_id, "machine_id", JOB_ID, "machine id"),
        require(attempt_id, "attempt_id", JOB_ID, "attempt id"),
    )


def _attempt_on(session: Session, machine_id: str, attempt_id: str) -> models.Attempt:
    attempt = session.get(models.Attempt, attempt_id)
    if attempt is None:
        raise NotFound(f"no attempt {attempt_id!r}", field="attempt_id")
    if attempt.machine_id != machine_id:
        raise FailedPrecondition("attempt runs on another machine", field="machine_id")
    return attempt


def latest_checkpoints(session: Session, job_ids: list[str]) -> dict[str, models.Checkpoint]:
    """Each job's newest checkpoint, for the attempts about to start."""
    if not job_ids:
        return {}
    newest = (
        select(models.Checkpoint.job_id, func.max(models.Checkpoint.sequence).label("seq"))
        .where(models.Checkpoint.job_id.in_(job_ids), models.Checkpoint.discarded_at.is_(None))
        .group_by(models.Checkpoint.job_id)
        .subquery()
    )
    rows = session.execute(
        select(models.Checkpoint).join(
            newest,
            (newest.c.job_id == models.Checkpoint.job_id) & (newest.c.seq == models.Checkpoint.sequence),
        )
    ).scalars()
    return {c.job_id: c for c in rows}
