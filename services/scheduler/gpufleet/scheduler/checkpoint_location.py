"""Where the scheduler keeps checkpoints, parsed from ``GPUFLEET_CHECKPOINT_URL``.

A folder serves one host (``gpufleet up``, compose with a volume); a bucket serves a
deployment whose scheduler replicas share no disk, such as pods that come and go on
Kubernetes. The text is checked when the settings load, so a typo stops the process at
start instead of failing the first checkpoint a film sends hours later.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

Scheme = Literal["file", "s3", "gs"]

# S3's and GCS's bucket names, loosely: what both accept starts and ends with a letter or
# digit and holds lowercase letters, digits, dots, hyphens (and underscores on GCS).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_SEGMENT = re.compile(r"^[A-Za-z0-9._=+@-]+$")


@dataclass(frozen=True)
class CheckpointLocation:
    """A folder (``scheme`` "file", ``path`` set) or a bucket and a key prefix in it."""

    scheme: Scheme
    path: Path | None = None
    bucket: str = ""
    prefix: str = ""

    @classmethod
    def folder(cls, path: str | Path) -> CheckpointLocation:
        return cls("file", path=Path(path))

    def __str__(self) -> str:
        if self.scheme == "file":
            return str(self.path)
        return f"{self.scheme}://{self.bucket}/{self.prefix}".rstrip("/")


def parse_checkpoint_location(text: str) -> CheckpointLocation:
    """A folder path (``/var/lib/gpufleet/checkpoints``, ``file:///...``) or a bucket URL
    (``s3://bucket/prefix``, ``gs://bucket/prefix``); ValueError saying what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("empty: give a folder, s3://bucket/prefix or gs://bucket/prefix")
    if "://" not in text:
        return CheckpointLocation.folder(text)
    parts = urlsplit(text)
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r}: a checkpoint location takes no query or fragment")
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ValueError(f"{text!r}: a file URL names a local folder (file:///path)")
        return CheckpointLocation.folder(parts.path)
    if parts.scheme not in ("s3", "gs"):
        raise ValueError(f"{text!r}: the scheme must be s3, gs or file (or a plain folder path)")
    if not _BUCKET.match(parts.netloc):
        raise ValueError(f"{text!r}: {parts.netloc!r} is not a bucket name")
    segments = [s for s in parts.path.split("/") if s]
    for segment in segments:
        if segment in (".", "..") or not _SEGMENT.match(segment):
            raise ValueError(f"{text!r}: {segment!r} is not allowed in the key prefix")
    scheme: Scheme = "s3" if parts.scheme == "s3" else "gs"
    return CheckpointLocation(scheme, bucket=parts.netloc, prefix="/".join(segments))
