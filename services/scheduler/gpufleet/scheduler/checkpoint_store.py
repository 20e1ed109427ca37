"""The contract every checkpoint store keeps, whatever holds the bytes.

Two stores keep it: a folder (:mod:`gpufleet.scheduler.checkpoint_folder`) and a bucket in
S3 or GCS (:mod:`gpufleet.scheduler.checkpoint_bucket`). Both answer the same calls with the
same errors, and one contract test suite runs against each, so the WorkerService calls above
them cannot tell which one serves:

- an upload is appended in order, by offset; a part that ends at or before what was received
  is a retry and changes nothing; one that would leave a gap is refused;
- a commit checks the bytes against the size and SHA-256 the worker announced; only then is
  the checkpoint readable under its id, whole: nothing half-written is ever visible, and a
  digest that does not match throws the upload away (the worker sends it again, whole);
- a store may be served by several scheduler processes at once (replicas, API processes):
  two of them answering retries of one upload end in the same bytes.
"""

from __future__ import annotations

from typing import Protocol

from gpufleet.common.errors import FailedPrecondition, InvalidArgument, NotFound
from gpufleet.scheduler.checkpoint_location import CheckpointLocation

PART_MAX_BYTES = 1 << 20
# Uploads untouched for longer than this are abandoned (a machine lost mid-send).
STALE_UPLOAD_S = 3600.0


class CheckpointStore(Protocol):
    max_bytes: int

    def append(self, upload_id: str, offset: int, data: bytes) -> int:
        """Append ``data`` at ``offset`` of upload ``upload_id``; the bytes received so far.
        InvalidArgument for a part too large or past ``max_bytes``; FailedPrecondition
        (field ``offset``) for a part that would leave a gap."""
        ...

    def commit(self, upload_id: str, checkpoint_id: str, size: int, sha256: str) -> None:
        """Keep upload ``upload_id`` as checkpoint ``checkpoint_id`` once its bytes match.
        NotFound (``upload_id``) for an upload the store does not hold (never sent, or
        committed already); FailedPrecondition (``size_bytes``) for a size that differs;
        FailedPrecondition (``sha256``) for a digest that differs, the upload dropped."""
        ...

    def read(self, checkpoint_id: str, offset: int, max_bytes: int) -> tuple[bytes, bool]:
        """Up to ``max_bytes`` from ``offset`` and whether they reach the end. NotFound
        (``checkpoint_id``) for a checkpoint the store does not keep."""
        ...

    def remove(self, checkpoint_id: str) -> None:
        """Forget a checkpoint; removing one that is gone already is no error."""
        ...

    def drop_stale_uploads(self, now_s: float | None = None) -> int:
        """Throw away uploads untouched for ``STALE_UPLOAD_S``; how many went."""
        ...


def check_part(offset: int, data: bytes, max_bytes: int) -> None:
    """The refusals every store makes before it looks at an upload."""
    if len(data) > PART_MAX_BYTES:
        raise InvalidArgument(f"a part holds at most {PART_MAX_BYTES} bytes", field="data")
    if offset + len(data) > max_bytes:
        raise InvalidArgument(f"a checkpoint holds at most {max_bytes} bytes", field="offset")


def gap(offset: int, received: int) -> FailedPrecondition:
    return FailedPrecondition(
        f"part at {offset} would leave a gap: {received} bytes received", field="offset"
    )


def no_upload(upload_id: str) -> NotFound:
    return NotFound(f"no upload {upload_id!r}", field="upload_id")


def wrong_size(got: int, size: int) -> FailedPrecondition:
    return FailedPrecondition(f"{got} bytes received, {size} announced", field="size_bytes")


def wrong_digest() -> FailedPrecondition:
    return FailedPrecondition("the bytes received do not match sha256", field="sha256")


def not_kept(checkpoint_id: str) -> NotFound:
    return NotFound(f"checkpoint {checkpoint_id!r} is no longer kept", field="checkpoint_id")


def open_checkpoint_store(location: CheckpointLocation, max_bytes: int) -> CheckpointStore:
    """The store for ``location``. Opening one makes no call: a bucket that cannot be
    reached shows at the first checkpoint, as UNAVAILABLE, and the worker tries again."""
    if location.scheme == "file":
        from gpufleet.scheduler.checkpoint_folder import FolderCheckpointStore

        assert location.path is not None
        return FolderCheckpointStore(location.path, max_bytes)
    # Imported here: a scheduler keeping checkpoints in a folder never loads the client.
    from gpufleet.scheduler.checkpoint_bucket import BucketCheckpointStore, bucket_for

    return BucketCheckpointStore(bucket_for(location), max_bytes, where=str(location))
