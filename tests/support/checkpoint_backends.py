"""The scheduler's checkpoint stores for one contract suite: a folder, and an S3 bucket on
moto's server over loopback.

Each backend gives what a scheduler process needs to use it (its environment), a store
built in the test's own process, and a look at what the store holds, read the way an
operator would look: the files in the folder, the objects in the bucket (through boto3,
not through the store under test).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from obstore.store import S3Store

from gpufleet.scheduler.checkpoint_bucket import BucketCheckpointStore
from gpufleet.scheduler.checkpoint_folder import FolderCheckpointStore
from gpufleet.scheduler.checkpoint_store import CheckpointStore
from tests.support.moto_server import DUMMY_CREDENTIALS, MotoServer

REGION = "us-east-1"
_buckets = itertools.count()


class CheckpointBackend(Protocol):
    name: str

    def env(self) -> dict[str, str]:
        """What a scheduler process is given to keep its checkpoints here."""
        ...

    def store(self, max_bytes: int) -> CheckpointStore:
        """A store on the same place, in this process (as a second scheduler would be)."""
        ...

    def kept(self) -> dict[str, bytes]:
        """Every committed checkpoint's bytes, by id, as the place itself shows them."""
        ...

    def staged(self) -> list[str]:
        """What uploads not yet committed left behind (file or object names)."""
        ...

    def traces(self, checkpoint_id: str) -> list[str]:
        """Anything still held for ``checkpoint_id`` (bytes, a manifest): [] once removed."""
        ...


@dataclass
class FolderBackend:
    root: Path
    name: str = "folder"

    def env(self) -> dict[str, str]:
        return {"GPUFLEET_CHECKPOINT_DIR": str(self.root)}

    def store(self, max_bytes: int) -> CheckpointStore:
        return FolderCheckpointStore(self.root, max_bytes)

    def kept(self) -> dict[str, bytes]:
        return {p.name.removesuffix(".ckpt"): p.read_bytes() for p in self.root.glob("*.ckpt")}

    def staged(self) -> list[str]:
        staging = self.root / "staging"
        return sorted(p.name for p in staging.iterdir()) if staging.is_dir() else []

    def traces(self, checkpoint_id: str) -> list[str]:
        return [p.name for p in self.root.glob(f"{checkpoint_id}*")]


@dataclass
class S3Backend:
    """A bucket of its own on moto, under a prefix (as a deployment would share one bucket)."""

    moto: MotoServer
    bucket: str = field(default_factory=lambda: f"checkpoints-{next(_buckets)}")
    prefix: str = "deployment-a/checkpoints"
    name: str = "s3"

    def __post_init__(self) -> None:
        self.client().create_bucket(Bucket=self.bucket)

    def client(self) -> Any:
        return self.moto.session().client("s3", region_name=REGION, endpoint_url=self.moto.url)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def env(self) -> dict[str, str]:
        # The standard variables of every S3 client; no gpufleet setting names credentials.
        return {
            "GPUFLEET_CHECKPOINT_URL": self.url,
            "AWS_ENDPOINT_URL": self.moto.url,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": REGION,
            **DUMMY_CREDENTIALS,
        }

    def store(self, max_bytes: int) -> CheckpointStore:
        bucket = S3Store(
            self.bucket,
            prefix=self.prefix,
            endpoint=self.moto.url,
            region=REGION,
            access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            client_options={"allow_http": True},
        )
        return BucketCheckpointStore(bucket, max_bytes, where=self.url)

    def keys(self, under: str = "") -> list[str]:
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=f"{self.prefix}/{under}")
        )
        return sorted(o["Key"].removeprefix(f"{self.prefix}/") for p in pages for o in p.get("Contents", []))

    def object(self, key: str) -> bytes:
        body = self.client().get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"]
        return bytes(body.read())

    def kept(self) -> dict[str, bytes]:
        """Checkpoints whose manifest exists, each its parts joined in order of offset."""
        out = {}
        for key in self.keys("checkpoints/"):
            if key.endswith("/manifest.json"):
                checkpoint_id = key.split("/")[1]
                parts = self.keys(f"checkpoints/{checkpoint_id}/parts/")
                out[checkpoint_id] = b"".join(self.object(k) for k in sorted(parts))
        return out

    def staged(self) -> list[str]:
        return self.keys("staging/")

    def traces(self, checkpoint_id: str) -> list[str]:
        return self.keys(f"checkpoints/{checkpoint_id}/")
