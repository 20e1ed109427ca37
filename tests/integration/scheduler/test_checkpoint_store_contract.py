"""The checkpoint store's contract (gpufleet.scheduler.checkpoint_store), held by each store:
a folder and an S3 bucket on moto's server. Two stores on one place stand for two scheduler
processes (replicas, API processes) answering the same worker.

What the scheduler process tests (test_checkpoints.py) cannot reach from outside is here:
nothing is readable before its commit ends, two processes racing on one part, a commit
retried, reads across part boundaries, stale uploads, and a bucket that cannot be reached.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from obstore.store import S3Store

from gpufleet.common.errors import FailedPrecondition, GpufleetError, InvalidArgument, NotFound, Unavailable
from gpufleet.scheduler.checkpoint_bucket import RETRIES, BucketCheckpointStore
from gpufleet.scheduler.checkpoint_store import PART_MAX_BYTES, STALE_UPLOAD_S, CheckpointStore
from tests.support.checkpoint_backends import REGION, CheckpointBackend, FolderBackend, S3Backend
from tests.support.moto_server import DUMMY_CREDENTIALS, MotoServer, start_moto_server
from tests.support.postgres import free_port

MAX = 4 * PART_MAX_BYTES
BLOB = hashlib.sha256(b"seed").digest() * (PART_MAX_BYTES // 32) * 2 + b"the tail"  # 2 parts + 8 B


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = start_moto_server()
    yield server
    server.stop()


@pytest.fixture(params=["folder", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointBackend:
    if request.param == "folder":
        return FolderBackend(tmp_path / "checkpoints")
    return S3Backend(request.getfixturevalue("moto"))


@pytest.fixture
def store(backend: CheckpointBackend) -> CheckpointStore:
    return backend.store(MAX)


def upload(store: CheckpointStore, blob: bytes, part: int = PART_MAX_BYTES) -> str:
    upload_id = str(uuid.uuid4())
    for offset in range(0, len(blob), part):
        assert store.append(upload_id, offset, blob[offset : offset + part]) == min(len(blob), offset + part)
    return upload_id


def read_all(store: CheckpointStore, checkpoint_id: str, step: int = PART_MAX_BYTES) -> bytes:
    out = b""
    while True:
        data, eof = store.read(checkpoint_id, len(out), step)
        out += data
        if eof:
            return out


def at_once(calls: list[Callable[[], int]]) -> list[int]:
    """Every call on a thread of its own, released together; their answers."""
    answers: list[int] = []
    start = threading.Barrier(len(calls))

    def run(call: Callable[[], int]) -> None:
        start.wait()
        answers.append(call())

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def refused(call: Callable[[], object], kind: type[GpufleetError], field: str) -> GpufleetError:
    with pytest.raises(kind) as info:
        call()
    assert info.value.field == field, info.value
    return info.value


def test_a_checkpoint_is_readable_only_once_its_commit_ends(
    store: CheckpointStore, backend: CheckpointBackend
) -> None:
    upload_id = upload(store, BLOB)
    checkpoint_id = str(uuid.uuid4())
    refused(lambda: store.read(checkpoint_id, 0, 10), NotFound, "checkpoint_id")
    assert backend.kept() == {}

    store.commit(upload_id, checkpoint_id, len(BLOB), hashlib.sha256(BLOB).hexdigest())

    assert backend.kept() == {checkpoint_id: BLOB}
    assert backend.staged() == []
    assert read_all(store, checkpoint_id) == BLOB
    # A second process reads it too (no state of the first one's is needed).
    assert read_all(backend.store(MAX), checkpoint_id, step=300_000) == BLOB


def test_reads_cross_part_boundaries_and_say_where_the_end_is(store: CheckpointStore) -> None:
    checkpoint_id = str(uuid.uuid4())
    store.commit(upload(store, BLOB), checkpoint_id, len(BLOB), hashlib.sha256(BLOB).hexdigest())
    middle = PART_MAX_BYTES - 5
    assert store.read(checkpoint_id, middle, 10) == (BLOB[middle : middle + 10], False)
    assert store.read(checkpoint_id, 0, len(BLOB)) == (BLOB, True)
    assert store.read(checkpoint_id, len(BLOB) - 3, 100) == (b"ail", True)
    assert store.read(checkpoint_id, len(BLOB) + 7, 100) == (b"", True)


def test_a_commit_answered_twice_finds_no_upload_the_second_time(store: CheckpointStore) -> None:
    upload_id = upload(store, b"progress")
    digest = hashlib.sha256(b"progress").hexdigest()
    store.commit(upload_id, str(uuid.uuid4()), 8, digest)
    refused(lambda: store.commit(upload_id, str(uuid.uuid4()), 8, digest), NotFound, "upload_id")
    refused(lambda: store.commit(str(uuid.uuid4()), str(uuid.uuid4()), 8, digest), NotFound, "upload_id")


def test_a_wrong_size_keeps_the_upload_and_a_wrong_digest_drops_it(
    store: CheckpointStore, backend: CheckpointBackend
) -> None:
    upload_id = upload(store, b"progress")
    checkpoint_id = str(uuid.uuid4())
    error = refused(
        lambda: store.commit(upload_id, checkpoint_id, 9, "0" * 64), FailedPrecondition, "size_bytes"
    )
    assert "8 bytes received, 9 announced" in str(error)
    assert backend.staged() != []
    refused(lambda: store.commit(upload_id, checkpoint_id, 8, "0" * 64), FailedPrecondition, "sha256")
    assert backend.staged() == [] and backend.kept() == {}
    refused(lambda: store.read(checkpoint_id, 0, 8), NotFound, "checkpoint_id")


def test_parts_are_appended_in_order_and_bad_ones_refused(store: CheckpointStore) -> None:
    upload_id = str(uuid.uuid4())
    assert store.append(upload_id, 0, b"abcd") == 4
    assert store.append(upload_id, 0, b"abcd") == 4  # a retry
    assert store.append(upload_id, 2, b"cdef") == 6  # overlapping: only the new bytes
    assert store.append(upload_id, 6, b"") == 6
    error = refused(lambda: store.append(upload_id, 10, b"x"), FailedPrecondition, "offset")
    assert "6 bytes received" in str(error)
    refused(lambda: store.append(upload_id, 6, b"x" * (PART_MAX_BYTES + 1)), InvalidArgument, "data")
    refused(lambda: store.append(upload_id, MAX, b"x"), InvalidArgument, "offset")
    checkpoint_id = str(uuid.uuid4())
    store.commit(upload_id, checkpoint_id, 6, hashlib.sha256(b"abcdef").hexdigest())
    assert read_all(store, checkpoint_id) == b"abcdef"


def test_two_processes_answering_retries_of_one_upload_keep_its_bytes_once(
    backend: CheckpointBackend,
) -> None:
    """Each part is sent to both processes at the same moment, three times over (a worker
    whose answers were lost, its retries landing on the other replica), half of the sends
    longer than the others (a worker that restarted and cut its parts anew)."""
    first, second = backend.store(MAX), backend.store(MAX)
    upload_id = str(uuid.uuid4())
    part = 256 * 1024
    blob = BLOB[: 5 * part + 100]
    received = 0
    while received < len(blob):
        sends = [
            functools.partial(s.append, upload_id, received, blob[received : received + size])
            for s in (first, second)
            for size in (part, part + 777)
        ] * 3
        answers = at_once(sends)
        assert min(answers) >= min(len(blob), received + part)
        received = max(answers)
    assert first.append(upload_id, 0, blob[:10]) == len(blob)  # nothing more is owed
    checkpoint_id = str(uuid.uuid4())
    second.commit(upload_id, checkpoint_id, len(blob), hashlib.sha256(blob).hexdigest())
    assert backend.kept() == {checkpoint_id: blob}
    assert read_all(first, checkpoint_id) == blob


def test_a_removed_checkpoint_is_gone_whole_and_removing_again_is_no_error(
    store: CheckpointStore, backend: CheckpointBackend
) -> None:
    checkpoint_id = str(uuid.uuid4())
    store.commit(upload(store, BLOB), checkpoint_id, len(BLOB), hashlib.sha256(BLOB).hexdigest())
    assert read_all(store, checkpoint_id) == BLOB  # the reader's process remembers it now
    store.remove(checkpoint_id)
    store.remove(checkpoint_id)
    assert backend.traces(checkpoint_id) == []
    refused(lambda: store.read(checkpoint_id, 0, 10), NotFound, "checkpoint_id")


def test_uploads_abandoned_for_an_hour_are_dropped_and_fresh_ones_kept(
    store: CheckpointStore, backend: CheckpointBackend
) -> None:
    abandoned = upload(store, BLOB)  # three parts, one upload
    assert store.drop_stale_uploads(time.time()) == 0
    assert store.drop_stale_uploads(time.time() + STALE_UPLOAD_S + 60) == 1
    assert backend.staged() == []
    refused(lambda: store.commit(abandoned, str(uuid.uuid4()), len(BLOB), "0" * 64), NotFound, "upload_id")


def s3_store(endpoint: str, bucket: str) -> BucketCheckpointStore:
    client = S3Store(
        bucket,
        prefix="p",
        endpoint=endpoint,
        region=REGION,
        access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        client_options={"allow_http": True},
        retry_config=RETRIES,
    )
    return BucketCheckpointStore(client, MAX, where=f"s3://{bucket}/p")


@pytest.mark.parametrize("where", ["nothing listens", "no such bucket"])
def test_a_bucket_that_cannot_be_used_answers_unavailable_naming_the_store(
    moto: MotoServer, where: str
) -> None:
    if where == "nothing listens":
        store = s3_store(f"http://127.0.0.1:{free_port()}", "checkpoints")
    else:
        store = s3_store(moto.url, "never-made")
    for call in (
        lambda: store.append(str(uuid.uuid4()), 0, b"x"),
        lambda: store.commit(str(uuid.uuid4()), str(uuid.uuid4()), 1, "0" * 64),
        lambda: store.drop_stale_uploads(),
    ):
        with pytest.raises(Unavailable) as info:
            call()
        assert str(info.value).startswith(f"the checkpoint store {store.where} could not be reached")
