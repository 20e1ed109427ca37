"""GPUFLEET_CHECKPOINT_URL as the scheduler's settings read it: a folder or a bucket, a
malformed one refused at load naming the setting, and the folder setting as the fallback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.scheduler.checkpoint_location import CheckpointLocation, parse_checkpoint_location
from gpufleet.scheduler.settings import Settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s3://gpufleet-checkpoints", CheckpointLocation("s3", bucket="gpufleet-checkpoints")),
        ("s3://ckpt.example/prod/eu/", CheckpointLocation("s3", bucket="ckpt.example", prefix="prod/eu")),
        ("gs://gpufleet_ckpt/prod//a", CheckpointLocation("gs", bucket="gpufleet_ckpt", prefix="prod/a")),
        ("/var/lib/gpufleet/checkpoints", CheckpointLocation.folder("/var/lib/gpufleet/checkpoints")),
        ("var/checkpoints", CheckpointLocation.folder("var/checkpoints")),
        ("file:///srv/ckpt", CheckpointLocation.folder("/srv/ckpt")),
    ],
)
def test_a_folder_or_a_bucket_is_read(text: str, expected: CheckpointLocation) -> None:
    assert parse_checkpoint_location(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("az://container/prefix", "the scheme must be s3, gs or file"),
        ("https://bucket.s3.amazonaws.com/x", "the scheme must be s3, gs or file"),
        ("s3://", "is not a bucket name"),
        ("s3://Upper_Case", "is not a bucket name"),
        ("s3://bucket/a/../b", "'..' is not allowed"),
        ("s3://bucket/prefix?versionId=1", "no query or fragment"),
        ("file://otherhost/srv", "a file URL names a local folder"),
    ],
)
def test_a_malformed_location_says_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_checkpoint_location(text)


def test_settings_take_the_url_over_the_folder_and_fall_back_to_it() -> None:
    bucket = Settings(checkpoint_url="s3://ckpt/prod", checkpoint_dir="/srv/ckpt")  # type: ignore[arg-type]
    assert bucket.checkpoint_location() == CheckpointLocation("s3", bucket="ckpt", prefix="prod")
    assert str(bucket.checkpoint_location()) == "s3://ckpt/prod"
    folder = Settings(checkpoint_url="  ", checkpoint_dir="/srv/ckpt")  # type: ignore[arg-type]
    assert folder.checkpoint_url is None
    assert folder.checkpoint_location() == CheckpointLocation("file", path=Path("/srv/ckpt"))


def test_a_malformed_url_stops_the_settings_naming_it() -> None:
    with pytest.raises(ValidationError) as info:
        Settings(checkpoint_url="ftp://ckpt/prod")  # type: ignore[arg-type]
    assert info.value.errors()[0]["loc"] == ("checkpoint_url",)
    assert "the scheme must be s3, gs or file" in str(info.value)
