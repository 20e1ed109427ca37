"""Checkpoints through a real scheduler process on PostgreSQL: sent in parts, committed
against their size and SHA-256, kept (the newest two of a job), read back by the job's
next attempt — and every refusal: another machine's attempt, an ended attempt, a kind
that keeps none, a gap, an oversized part, a wrong digest, another job's checkpoint.

Every test runs once per store: a folder (GPUFLEET_CHECKPOINT_DIR) and an S3 bucket on
moto's server (GPUFLEET_CHECKPOINT_URL=s3://...), what is kept read from the place itself."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import job_service_pb2, job_service_pb2_grpc, worker_service_pb2, worker_service_pb2_grpc
from tests.support import tls
from tests.support.checkpoint_backends import CheckpointBackend, FolderBackend, S3Backend
from tests.support.fleet_rows import add_machine
from tests.support.moto_server import MotoServer, start_moto_server
from tests.support.procs import ServiceProcess, start_service


def now() -> datetime:
    """The time of each row, taken when it is written: the module is imported at collection,
    minutes before its last test runs, and a lease from then has run out by then (the
    scheduler's tick would mark the attempt LOST under the test)."""
    return datetime.now(UTC)


PART = 1 << 20


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = start_moto_server()
    yield server
    server.stop()


@pytest.fixture(params=["folder", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointBackend:
    if request.param == "folder":
        return FolderBackend(tmp_path / "checkpoints")
    return S3Backend(request.getfixturevalue("moto"))


@pytest.fixture
def scheduler_with_store(pg_url: str, tmp_path: Path, store: CheckpointBackend) -> Iterator[ServiceProcess]:
    svc = start_service(
        "scheduler",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
            "GPUFLEET_CHECKPOINT_MAX_BYTES": str(3 * PART),
            **store.env(),
        },
    )
    yield svc
    svc.stop()


@pytest.fixture
def sessions(pg_url: str, scheduler_with_store: ServiceProcess) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def stub(scheduler_with_store: ServiceProcess) -> Iterator[worker_service_pb2_grpc.WorkerServiceStub]:
    stubs = tls.AsNamedMachine(scheduler_with_store.address, worker_service_pb2_grpc.WorkerServiceStub)
    yield stubs  # type: ignore[misc]
    stubs.close()


def attempt(
    sessions: sessionmaker[Session], machine_id: str, *, kind: str = "film", state: str = "RUNNING"
) -> str:
    job_id, attempt_id = str(uuid.uuid4()), str(uuid.uuid4())
    with sessions() as s, s.begin():
        s.add(
            models.Job(
                id=job_id,
                request_id=job_id,
                request_hash="h",
                workspace_id="acme-studio",
                pool_id="l4",
                kind_id=kind,
                pipeline_version="2026.12.0",
                tenant_values={},
                state="RUNNING",
                created_at=now(),
                updated_at=now(),
            )
        )
        s.flush()
        s.add(
            models.Attempt(
                id=attempt_id,
                job_id=job_id,
                machine_id=machine_id,
                slot=0,
                slots=2,
                state=state,
                started_at=now(),
                lease_expires_at=now() + timedelta(minutes=5),
            )
        )
    return attempt_id


def send(
    stub: worker_service_pb2_grpc.WorkerServiceStub, machine_id: str, attempt_id: str, blob: bytes
) -> int:
    upload = str(uuid.uuid4())
    for offset in range(0, len(blob), PART):
        stub.PutCheckpointPart(
            worker_service_pb2.PutCheckpointPartRequest(
                machine_id=machine_id,
                attempt_id=attempt_id,
                upload_id=upload,
                offset=offset,
                data=blob[offset : offset + PART],
            ),
            timeout=10,
        )
    done = stub.CommitCheckpoint(
        worker_service_pb2.CommitCheckpointRequest(
            machine_id=machine_id,
            attempt_id=attempt_id,
            upload_id=upload,
            size_bytes=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
        ),
        timeout=10,
    )
    return int(done.sequence)


def read_all(
    stub: worker_service_pb2_grpc.WorkerServiceStub, machine_id: str, attempt_id: str, checkpoint_id: str
) -> bytes:
    out = b""
    while True:
        part = stub.ReadCheckpoint(
            worker_service_pb2.ReadCheckpointRequest(
                machine_id=machine_id, attempt_id=attempt_id, checkpoint_id=checkpoint_id, offset=len(out)
            ),
            timeout=10,
        )
        out += part.data
        if part.eof:
            return out


def refused(call: object, code: grpc.StatusCode, field: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    assert info.value.code() == code, info.value  # type: ignore[attr-defined]
    assert dict(info.value.trailing_metadata() or ()).get("gpufleet-field") == field  # type: ignore[attr-defined]


def checkpoints_of(sessions: sessionmaker[Session], attempt_id: str) -> list[models.Checkpoint]:
    with sessions() as s:
        return list(
            s.execute(
                select(models.Checkpoint)
                .where(models.Checkpoint.attempt_id == attempt_id)
                .order_by(models.Checkpoint.sequence)
            ).scalars()
        )


def test_a_checkpoint_sent_in_parts_is_kept_and_read_back_by_the_next_attempt(
    sessions: sessionmaker[Session],
    stub: worker_service_pb2_grpc.WorkerServiceStub,
    store: CheckpointBackend,
    scheduler_with_store: ServiceProcess,
) -> None:
    machine = add_machine(sessions, now(), pool_id="l4")
    first = attempt(sessions, machine)
    blob = bytes(range(256)) * (PART // 256) * 2 + b"tail"  # three parts, the last short
    assert send(stub, machine, first, blob) == 1
    (kept,) = checkpoints_of(sessions, first)
    assert (kept.size_bytes, kept.sha256) == (len(blob), hashlib.sha256(blob).hexdigest())
    assert store.kept() == {kept.id: blob}
    assert store.staged() == [], "the upload left nothing behind"

    # The job's next attempt, on another machine, reads it back whole.
    with sessions() as s, s.begin():
        a = s.get_one(models.Attempt, first)
        a.state, a.ended_at = "LOST", now()
        job_id = a.job_id
        other = add_machine(sessions, now(), pool_id="l4")
        second = str(uuid.uuid4())
        s.add(
            models.Attempt(
                id=second,
                job_id=job_id,
                machine_id=other,
                slot=0,
                slots=2,
                state="STARTING",
                started_at=now(),
                lease_expires_at=now() + timedelta(minutes=5),
                checkpoint_id=kept.id,
            )
        )
    assert read_all(stub, other, second, kept.id) == blob
    # GetJob shows which checkpoint the attempt started from.
    with scheduler_with_store.channel() as channel:
        job = job_service_pb2_grpc.JobServiceStub(channel).GetJob(
            job_service_pb2.GetJobRequest(job_id=job_id), timeout=5
        )
    by_id = {a.attempt_id: a for a in job.attempts}
    assert not by_id[first].HasField("started_from")
    assert (by_id[second].started_from.checkpoint_id, by_id[second].started_from.sequence) == (kept.id, 1)
    # The machine that lost it cannot read it; another job's attempt cannot either.
    refused(
        lambda: read_all(stub, machine, second, kept.id), grpc.StatusCode.FAILED_PRECONDITION, "machine_id"
    )
    stranger = attempt(sessions, other)
    refused(lambda: read_all(stub, other, stranger, kept.id), grpc.StatusCode.NOT_FOUND, "checkpoint_id")


def test_only_the_newest_two_of_a_job_are_kept(
    sessions: sessionmaker[Session], stub: worker_service_pb2_grpc.WorkerServiceStub, store: CheckpointBackend
) -> None:
    machine = add_machine(sessions, now(), pool_id="l4")
    a = attempt(sessions, machine)
    for n in range(1, 5):
        assert send(stub, machine, a, f"progress {n}".encode()) == n
    rows = checkpoints_of(sessions, a)
    kept = [c for c in rows if c.discarded_at is None]
    assert [c.sequence for c in kept] == [3, 4]
    assert sorted(store.kept()) == sorted(c.id for c in kept)
    # The older rows stay (an attempt shows what it started from); their bytes are gone.
    assert [c.sequence for c in rows if c.discarded_at is not None] == [1, 2]
    assert [store.traces(c.id) for c in rows[:2]] == [[], []]
    refused(lambda: read_all(stub, machine, a, rows[0].id), grpc.StatusCode.NOT_FOUND, "checkpoint_id")


def test_a_retried_part_is_accepted_and_a_gap_is_refused(
    sessions: sessionmaker[Session], stub: worker_service_pb2_grpc.WorkerServiceStub, store: CheckpointBackend
) -> None:
    machine = add_machine(sessions, now(), pool_id="l4")
    a = attempt(sessions, machine)
    upload = str(uuid.uuid4())

    def put(offset: int, data: bytes) -> int:
        return int(
            stub.PutCheckpointPart(
                worker_service_pb2.PutCheckpointPartRequest(
                    machine_id=machine, attempt_id=a, upload_id=upload, offset=offset, data=data
                ),
                timeout=10,
            ).received_bytes
        )

    assert put(0, b"abcd") == 4
    assert put(0, b"abcd") == 4  # the answer was lost; the worker sends it again
    assert put(2, b"cdef") == 6  # overlapping: only what is new is written
    refused(lambda: put(10, b"x"), grpc.StatusCode.FAILED_PRECONDITION, "offset")
    refused(lambda: put(6, b"x" * (PART + 1)), grpc.StatusCode.INVALID_ARGUMENT, "data")
    refused(lambda: put(3 * PART, b"x"), grpc.StatusCode.INVALID_ARGUMENT, "offset")
    # A digest that does not match: refused, nothing kept, and the upload starts over.
    refused(
        lambda: stub.CommitCheckpoint(
            worker_service_pb2.CommitCheckpointRequest(
                machine_id=machine, attempt_id=a, upload_id=upload, size_bytes=6, sha256="0" * 64
            ),
            timeout=10,
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "sha256",
    )
    assert checkpoints_of(sessions, a) == []
    assert store.kept() == {} and store.staged() == []
    assert put(0, b"x") == 1


@pytest.mark.parametrize(
    ("setup", "field", "code"),
    [
        ("other_machine", "machine_id", grpc.StatusCode.FAILED_PRECONDITION),
        ("ended", "attempt_id", grpc.StatusCode.FAILED_PRECONDITION),
        ("short_kind", "attempt_id", grpc.StatusCode.FAILED_PRECONDITION),
        ("unknown", "attempt_id", grpc.StatusCode.NOT_FOUND),
        ("bad_upload_id", "upload_id", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_a_part_from_the_wrong_caller_is_refused_naming_its_field(
    sessions: sessionmaker[Session],
    stub: worker_service_pb2_grpc.WorkerServiceStub,
    store: CheckpointBackend,
    setup: str,
    field: str,
    code: grpc.StatusCode,
) -> None:
    machine = add_machine(sessions, now(), pool_id="l4")
    caller, upload = machine, str(uuid.uuid4())
    a = attempt(
        sessions,
        machine,
        kind="short_episode" if setup == "short_kind" else "film",
        state="SUCCEEDED" if setup == "ended" else "RUNNING",
    )
    if setup == "other_machine":
        caller = add_machine(sessions, now(), pool_id="l4")
    if setup == "unknown":
        a = str(uuid.uuid4())
    if setup == "bad_upload_id":
        upload = "../../etc/passwd"
    refused(
        lambda: stub.PutCheckpointPart(
            worker_service_pb2.PutCheckpointPartRequest(
                machine_id=caller, attempt_id=a, upload_id=upload, offset=0, data=b"x"
            ),
            timeout=10,
        ),
        code,
        field,
    )
    assert store.staged() == []
