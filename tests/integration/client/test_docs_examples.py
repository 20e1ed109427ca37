"""docs/client.md's examples run as written — only the address and the certificate folder
changed — against a real system that runs their jobs (every service a real process, local
machines, the shared clock moved forward meanwhile)."""

from __future__ import annotations

import contextlib
import io
import re
import threading
from pathlib import Path

import pytest

from tests.e2e.fleet import Fleet

pytestmark = pytest.mark.e2e

DOC = Path(__file__).resolve().parents[3] / "docs/client.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.DOTALL)


def test_the_examples_run_as_written(system: Fleet, backend_certs: Path) -> None:
    blocks = examples()
    assert len(blocks) == 2, "the sync and the asyncio example"
    address = f"127.0.0.1:{system.scheduler_port}"
    stop = threading.Event()

    def move_the_clock() -> None:
        while not stop.wait(0.05):
            system.clock.advance(2)

    mover = threading.Thread(target=move_the_clock, daemon=True)
    mover.start()
    printed = io.StringIO()
    try:
        for block in blocks:
            code = block.replace('"127.0.0.1:50051"', repr(address)).replace(
                '"certs/backend"', repr(str(backend_certs))
            )
            with contextlib.redirect_stdout(printed):
                exec(compile(code, str(DOC), "exec"), {"__name__": "docs_example"})
    finally:
        stop.set()
        mover.join()
    out = printed.getvalue()
    # What the examples print: the kinds' defaults, the job's way to SUCCEEDED, the bad field.
    assert "clip l4 2026.12.0" in out
    assert "JOB_STATE_RUNNING" in out and "JOB_STATE_SUCCEEDED" in out
    assert "job.pool INVALID_FORMAT" in out
    assert out.count("JOB_STATE_SUCCEEDED") >= 2, out  # the sync watch, and the list after it
