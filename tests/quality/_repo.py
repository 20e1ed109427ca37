"""Paths and a subprocess helper shared by the quality gates (lint, types, boundaries,
protos, deployment files). Each gate runs the real tool the way a developer would."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent

SERVICES = ("scheduler", "reaper", "provisioner", "sweeper", "agent")
# Where each portion of the gpufleet namespace package lives, relative to the repo root.
PACKAGE_DIRS = {
    "v1": "protos",
    "common": "libs/common",
    "cli": "libs/cli",
    **{name: f"services/{name}" for name in SERVICES},
}


def tool(name: str) -> str:
    """A console script of the test run's own virtual environment (never the machine's)."""
    path = VENV_BIN / name
    assert path.exists(), f"{path} is missing: run scripts/bootstrap --dev"
    return str(path)


def run(
    argv: list[str], cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def copy_tree(dest: Path, *relative: str) -> None:
    """Copy parts of the repository into ``dest`` keeping their paths (no caches)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", ".mypy_cache")
    for rel in relative:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=ignore)
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
