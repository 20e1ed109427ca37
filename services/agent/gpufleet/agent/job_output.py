"""The job's output on its way to its log: the runner copies it, redacting the attempt's
tokens first (its own module so runner.py stays one job's start-to-verdict story)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from gpufleet.agent.redact import Redactor


def copy_output(proc: subprocess.Popen[bytes], log_path: Path, redactor: Redactor | None = None) -> None:
    """The job's stdout and stderr, appended to its log as they come — with the attempt's
    tokens redacted first, so no form of one is ever written on the machine's disk."""
    assert proc.stdout is not None
    scrub = redactor or Redactor(())
    with open(log_path, "ab") as job_log:
        while chunk := os.read(proc.stdout.fileno(), 65536):
            job_log.write(scrub.feed(chunk))
            job_log.flush()
        job_log.write(scrub.flush())
    proc.stdout.close()
