"""Checkpoints in an S3 or GCS bucket, so that they outlive the pod of any scheduler replica.

The client is obstore (Rust's ``object_store`` crate): one API for S3 and GCS, so the code
the moto tests run is also the code that talks to GCS; a storage client only, with no
compute API in it; and none of botocore's pins, which the provisioner's boto3 sets for the
whole development environment (s3fs's aiobotocore pins an older botocore than that).
Credentials and endpoints come from the process's standard environment (``AWS_*``,
``GOOGLE_*``, an IRSA or workload-identity token), never from gpufleet's settings: they
give access to the checkpoint bucket only, not to machines, which stay the provisioner's.

Objects under the location's prefix:

- ``staging/<upload id>/<offset>``: one object per part received, at the offset where it
  starts (twelve digits). A part is written only where the bytes received so far end, and
  only if no object is there yet (a conditional put), so two scheduler processes answering
  retries of one upload never overwrite each other: the loser reads what the winner wrote.
- ``checkpoints/<checkpoint id>/parts/<offset>``: the upload's parts, copied inside the
  store once its size and SHA-256 match;
- ``checkpoints/<checkpoint id>/manifest.json``: written last, in one put. A checkpoint
  exists only once its manifest does, so nothing half-copied can ever be read; a crash
  before it leaves parts no manifest names (as the folder store leaves a file no row names).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError, PreconditionError
from obstore.store import GCSStore, S3Store

from gpufleet.common.errors import Unavailable
from gpufleet.scheduler.checkpoint_location import CheckpointLocation
from gpufleet.scheduler.checkpoint_store import (
    STALE_UPLOAD_S,
    check_part,
    gap,
    no_upload,
    not_kept,
    wrong_digest,
    wrong_size,
)

if TYPE_CHECKING:
    from obstore.store import ObjectStore, RetryConfig

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
# Copies of one commit's parts run side by side: a 64 MiB checkpoint is 64 copies.
COPY_WORKERS = 16
# Manifests never change once written: the newest few are kept in memory for reads.
MANIFESTS_KEPT = 256
# A retry of one part may meet a part another process wrote at the same offset; each
# round moves ``received`` on, so a few rounds always settle it.
APPEND_ROUNDS = 8
# Retries are bounded, so a bucket that fails answers UNAVAILABLE within a worker's deadline
# instead of holding a WorkerService thread for the client's default three minutes. (Each
# request keeps the client's own 5 s connect and 30 s request timeouts: client options
# given here would replace those the environment sets, AWS_ALLOW_HTTP among them.)
RETRIES: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=10)}


def bucket_for(location: CheckpointLocation) -> ObjectStore:
    """The client for ``location``'s bucket; endpoint and credentials from the environment."""
    prefix = location.prefix or None
    if location.scheme == "s3":
        return S3Store(location.bucket, prefix=prefix, retry_config=RETRIES)
    if location.scheme == "gs":
        return GCSStore(location.bucket, prefix=prefix, retry_config=RETRIES)
    raise ValueError(f"{location} is not a bucket")


@dataclass(frozen=True, order=True)
class Part:
    offset: int
    size: int
    path: str = ""
    modified_s: float = 0.0

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class Manifest:
    size_bytes: int
    sha256: str
    parts: tuple[Part, ...]

    def encode(self) -> bytes:
        body = {
            "size_bytes": self.size_bytes,
            "sha256": self.sha256,
            "parts": [[p.offset, p.size] for p in self.parts],
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, checkpoint_id: str, data: bytes) -> Manifest:
        body = json.loads(data)
        parts = tuple(
            Part(offset, size, _part_key(_checkpoint_key(checkpoint_id), offset))
            for offset, size in body["parts"]
        )
        return cls(int(body["size_bytes"]), str(body["sha256"]), parts)


def _staging_key(upload_id: str) -> str:
    return f"staging/{upload_id}"


def _checkpoint_key(checkpoint_id: str) -> str:
    return f"checkpoints/{checkpoint_id}"


def _part_key(under: str, offset: int) -> str:
    leaf = "parts/" if under.startswith("checkpoints/") else ""
    return f"{under}/{leaf}{offset:012d}"


def _tiled(parts: list[Part]) -> tuple[list[Part], int]:
    """The parts that follow one another from offset 0, and where they end. Each part is
    written where the previous one ends, so every part is among them; one past a gap could
    only be a part of an upload that was dropped under a slow writer, and is ignored."""
    received = 0
    tiled: list[Part] = []
    for part in parts:
        if part.offset != received:
            break
        tiled.append(part)
        received = part.end
    return tiled, received


class BucketCheckpointStore:
    def __init__(self, bucket: ObjectStore, max_bytes: int, *, where: str) -> None:
        self.bucket = bucket
        self.max_bytes = max_bytes
        self.where = where  # for messages: s3://bucket/prefix
        self._manifests: OrderedDict[str, Manifest] = OrderedDict()
        self._lock = threading.Lock()
        self._copier = ThreadPoolExecutor(COPY_WORKERS, thread_name_prefix="checkpoint-copy")

    # ---- the contract (gpufleet.scheduler.checkpoint_store.CheckpointStore) -----------

    def append(self, upload_id: str, offset: int, data: bytes) -> int:
        check_part(offset, data, self.max_bytes)
        staging = _staging_key(upload_id)
        with self._reaching():
            for _ in range(APPEND_ROUNDS):
                _, received = _tiled(self._parts(staging))
                if offset > received:
                    raise gap(offset, received)
                if offset + len(data) <= received:
                    return received
                try:
                    obstore.put(
                        self.bucket,
                        _part_key(staging, received),
                        data[received - offset :],
                        mode="create",
                        use_multipart=False,
                    )
                except (AlreadyExistsError, PreconditionError):
                    continue  # another process wrote there first: read again what it wrote
                return offset + len(data)
        raise Unavailable(f"upload {upload_id!r}: parts kept arriving at the same offset; send again")

    def commit(self, upload_id: str, checkpoint_id: str, size: int, sha256: str) -> None:
        staging = _staging_key(upload_id)
        with self._reaching():
            parts = self._parts(staging)
            if not parts:
                raise no_upload(upload_id)
            tiled, received = _tiled(parts)
            if received != size:
                raise wrong_size(received, size)
            digest = hashlib.sha256()
            try:
                for part in tiled:
                    digest.update(obstore.get(self.bucket, part.path).bytes())
            except (FileNotFoundError, NotFoundError):
                # Another process committed (or dropped) this upload while we read it.
                raise no_upload(upload_id) from None
            if digest.hexdigest() != sha256:
                self._delete([p.path for p in parts])  # corrupt: the worker sends it again, whole
                raise wrong_digest()
            under = _checkpoint_key(checkpoint_id)
            kept = tuple(Part(p.offset, p.size, _part_key(under, p.offset)) for p in tiled)
            try:
                list(
                    self._copier.map(
                        lambda pair: obstore.copy(self.bucket, pair[0].path, pair[1].path),
                        zip(tiled, kept, strict=True),
                    )
                )
            except (FileNotFoundError, NotFoundError):
                raise no_upload(upload_id) from None
            manifest = Manifest(size, sha256, kept)
            obstore.put(self.bucket, f"{under}/{MANIFEST}", manifest.encode(), mode="create")
            self._remember(checkpoint_id, manifest)
            self._delete([p.path for p in parts])

    def read(self, checkpoint_id: str, offset: int, max_bytes: int) -> tuple[bytes, bool]:
        with self._reaching():
            manifest = self._manifest(checkpoint_id)
            end = min(offset + max_bytes, manifest.size_bytes)
            chunks: list[bytes] = []
            try:
                for part in manifest.parts:
                    if part.end <= offset or part.offset >= end:
                        continue
                    start, stop = max(offset, part.offset), min(end, part.end)
                    got = obstore.get_range(
                        self.bucket, part.path, start=start - part.offset, end=stop - part.offset
                    )
                    chunks.append(bytes(got))
            except (FileNotFoundError, NotFoundError):
                self._forget(checkpoint_id)  # removed while we read it
                raise not_kept(checkpoint_id) from None
            return b"".join(chunks), end >= manifest.size_bytes

    def remove(self, checkpoint_id: str) -> None:
        under = _checkpoint_key(checkpoint_id)
        self._forget(checkpoint_id)
        with self._reaching():
            # The manifest first: from then on the checkpoint is gone for every reader.
            self._delete([f"{under}/{MANIFEST}"])
            self._delete(
                [meta["path"] for batch in obstore.list(self.bucket, prefix=under) for meta in batch]
            )

    def drop_stale_uploads(self, now_s: float | None = None) -> int:
        newest: dict[str, float] = {}
        paths: dict[str, list[str]] = {}
        with self._reaching():
            for batch in obstore.list(self.bucket, prefix="staging"):
                for meta in batch:
                    upload = meta["path"].split("/")[-2]
                    modified = meta["last_modified"].timestamp()
                    newest[upload] = max(newest.get(upload, modified), modified)
                    paths.setdefault(upload, []).append(meta["path"])
            now = time.time() if now_s is None else now_s
            stale = [u for u, modified in newest.items() if now - modified > STALE_UPLOAD_S]
            for upload in stale:
                self._delete(paths[upload])
        return len(stale)

    # ---- helpers -------------------------------------------------------------------------

    def _parts(self, under: str) -> list[Part]:
        parts = []
        for batch in obstore.list(self.bucket, prefix=under):
            for meta in batch:
                leaf = meta["path"].rsplit("/", 1)[-1]
                if leaf.isdigit():
                    parts.append(
                        Part(int(leaf), meta["size"], meta["path"], meta["last_modified"].timestamp())
                    )
        return sorted(parts)

    def _manifest(self, checkpoint_id: str) -> Manifest:
        with self._lock:
            if checkpoint_id in self._manifests:
                self._manifests.move_to_end(checkpoint_id)
                return self._manifests[checkpoint_id]
        try:
            data = obstore.get(self.bucket, f"{_checkpoint_key(checkpoint_id)}/{MANIFEST}").bytes()
        except (FileNotFoundError, NotFoundError):
            raise not_kept(checkpoint_id) from None
        manifest = Manifest.decode(checkpoint_id, bytes(data))
        self._remember(checkpoint_id, manifest)
        return manifest

    def _remember(self, checkpoint_id: str, manifest: Manifest) -> None:
        with self._lock:
            self._manifests[checkpoint_id] = manifest
            while len(self._manifests) > MANIFESTS_KEPT:
                self._manifests.popitem(last=False)

    def _forget(self, checkpoint_id: str) -> None:
        with self._lock:
            self._manifests.pop(checkpoint_id, None)

    def _delete(self, paths: list[str]) -> None:
        for start in range(0, len(paths), 1000):  # S3's DeleteObjects takes 1000 keys a call
            obstore.delete(self.bucket, paths[start : start + 1000])

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """The store's own failures (unreachable, refused credentials, a 5xx past the
        retries) as UNAVAILABLE: the worker keeps its checkpoint and sends it again."""
        try:
            yield
        except (BaseError, OSError) as err:
            # A missing object the contract expects is answered where it is read; one that
            # gets here (the bucket itself missing) is the store's failure like the rest.
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            log.warning("checkpoint store %s: %s", self.where, first, extra={"fields": {"store": self.where}})
            raise Unavailable(f"the checkpoint store {self.where} could not be reached: {first}") from err
