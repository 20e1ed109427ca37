"""The pipeline's code, installed once per version into a read-only place every slot shares.

The first job that needs version ``v`` installs it into ``<root>/<v>/`` (copied from the
configured source, or the bundled sample pipeline), under a lock, into a temporary folder
renamed into place — so a half-installed version is never used, and an installed one is
never changed. A job's sandbox shows it the folder of the version it started with, so a
newer version installed meanwhile cannot change a running job.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
from pathlib import Path

from gpufleet.agent import sample_pipeline
from gpufleet.agent.walls.wipe import remove_tree
from gpufleet.common import clock

VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
DEFAULT_VERSION = "default"


class PipelineError(Exception):
    """The pipeline version cannot be installed."""


def bundled_sample() -> list[Path]:
    """The files of the stand-in pipeline shipped with gpufleet (standalone: stdlib only)."""
    return [Path(sample_pipeline.__file__), Path(clock.__file__)]


def bundled_digest() -> str:
    """Names the bundled sample's content: an installed version is never changed, so a
    gpufleet upgrade that changes the sample installs it anew rather than reusing the old."""
    digest = hashlib.sha256()
    for file in bundled_sample():
        digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def install(root: Path, version: str, source: Path | None) -> Path:
    """The folder of ``version``, installing it first if it is not there yet."""
    version = version or DEFAULT_VERSION
    if not VERSION.match(version):
        raise PipelineError(f"pipeline version {version!r} is not a safe folder name")
    target = root / (version if source is not None else f"{version}.sample-{bundled_digest()}")
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    with open(root / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():  # installed by another runner while we waited
            return target
        staging = root / f".{target.name}.{os.getpid()}.tmp"
        remove_tree(staging)
        try:
            staging.mkdir(mode=0o755)
            _copy(staging, source)
            _read_only(staging)
            os.rename(staging, target)
        except OSError as err:
            remove_tree(staging)
            raise PipelineError(f"cannot install pipeline {version}: {err}") from err
    return target


def _copy(staging: Path, source: Path | None) -> None:
    if source is None:
        for file in bundled_sample():
            shutil.copyfile(file, staging / ("gpufleet_clock.py" if file.name == "clock.py" else file.name))
        return
    if not source.is_dir():
        raise PipelineError(f"pipeline source {source} is not a folder")
    shutil.copytree(source, staging, dirs_exist_ok=True, symlinks=True)


def _read_only(folder: Path) -> None:
    """Everyone may read and run it; nobody but root may change it."""
    for dirpath, dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink():
                path.chmod(0o755 if os.access(path, os.X_OK) else 0o644)
        del dirnames  # walked by os.walk itself
