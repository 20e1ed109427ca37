"""A stand-in GPU workload, shipped so gpufleet can be demonstrated end to end without
ChannelForge's real episode pipeline (which is not part of this project).

It behaves like a job from the runner's point of view: it reads its spec from the file
named by ``GPUFLEET_JOB_SPEC``, "renders" for ``tenant_values["duration_s"]`` seconds
(default 120) printing progress lines, and exits with ``tenant_values["exit_code"]``
(default 0). Time is the injected clock from the same ``GPUFLEET_CLOCK*`` settings as the
rest of the machine, so the sped-up demo clock (and a test's file clock) applies to it.
It echoes its tenant values as one JSON line, which is how the tests prove that values
full of shell syntax arrive byte for byte and are never executed.

It is standalone — the standard library and gpufleet's clock module, which the agent
installs beside it as ``gpufleet_clock.py`` — because a job runs as its slot's user under
the system Python, behind walls that hide gpufleet's own installation. It writes a little
to its folder, its home and ``/tmp`` as a real pipeline would, so every kind exercises the
walls' private folders.

With ``tenant_values["print_tokens"] = "1"`` it behaves like a careless job and prints its
tokens (``GPUFLEET_TOKENS_DIR``) in several encodings, split across writes and lines: the
agent must redact every one of them before its log leaves the machine.

A kind that resumes from checkpoints gets ``GPUFLEET_CHECKPOINT_DIR``: the pipeline keeps
its progress there (``progress.json``, written under a dot-name and renamed into place so
it is only ever taken whole) and, started again with a checkpoint, goes on from it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run with -I: no implicit path

try:
    from gpufleet_clock import clock_from_spec  # type: ignore[import-not-found]  # installed beside
except ImportError:  # run from gpufleet's own source tree
    from gpufleet.common.clock import clock_from_spec

DEFAULT_DURATION_S = 120.0
PROGRESS_STEPS = 10


def main() -> int:
    spec = json.loads(Path(os.environ["GPUFLEET_JOB_SPEC"]).read_text(encoding="utf-8"))
    values: dict[str, str] = spec.get("tenant_values", {})
    clock = clock_from_spec(
        os.environ.get("GPUFLEET_CLOCK", "real"),
        float(os.environ.get("GPUFLEET_CLOCK_SPEED", "1.0")),
        float(os.environ["GPUFLEET_CLOCK_ORIGIN"]) if os.environ.get("GPUFLEET_CLOCK_ORIGIN") else None,
        os.environ.get("GPUFLEET_CLOCK_FILE") or None,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    print(
        f"sample pipeline: job {spec['job_id']} attempt {spec['attempt_id']} "
        f"kind {spec.get('kind', '')!r} slot {spec['slot']}",
        flush=True,
    )
    print("tenant_values " + json.dumps(values, sort_keys=True), flush=True)
    for folder in (os.environ.get("GPUFLEET_JOB_DIR"), os.environ.get("HOME"), "/tmp"):
        if folder:
            try:
                Path(folder, f"scratch-{spec['attempt_id']}").write_text("frame cache\n")
            except OSError as err:
                print(f"sample pipeline: cannot write in {folder}: {err}", file=sys.stderr, flush=True)
    if values.get("print_tokens") == "1":
        print_tokens(os.environ.get("GPUFLEET_TOKENS_DIR", ""))
    try:
        duration = float(values.get("duration_s", DEFAULT_DURATION_S))
        exit_code = int(values.get("exit_code", 0))
    except ValueError as err:
        print(f"sample pipeline: bad tenant value: {err}", file=sys.stderr, flush=True)
        return 2
    step = max(duration, 0.0) / PROGRESS_STEPS
    checkpoint = (
        Path(os.environ["GPUFLEET_CHECKPOINT_DIR"]) if os.environ.get("GPUFLEET_CHECKPOINT_DIR") else None
    )
    already = resume_from(checkpoint)
    if already:
        print(
            f"sample pipeline: resuming from checkpoint: {already * 100 // PROGRESS_STEPS}% already rendered",
            flush=True,
        )
    for done in range(already + 1, PROGRESS_STEPS + 1):
        if clock.wait(step, stop):
            print("sample pipeline: stopped before the end", flush=True)
            return 143
        print(f"rendering: {done * 100 // PROGRESS_STEPS}%", flush=True)
        if checkpoint is not None:
            keep_progress(checkpoint, done, spec["attempt_id"])
    print(f"sample pipeline: done, exiting with {exit_code}", flush=True)
    return exit_code


def print_tokens(folder: str) -> None:
    """What a careless job does with its credentials: print them, every way."""
    import base64
    import urllib.parse

    if not folder:
        print("sample pipeline: no tokens given", flush=True)
        return
    for scope in sorted(os.listdir(folder)):
        token = Path(folder, scope).read_text(encoding="utf-8")
        raw = token.encode()
        print(f"{scope} token: {token}", flush=True)
        print(f"{scope} base64: {base64.b64encode(b'Bearer ' + raw).decode()}", flush=True)
        print(f"{scope} urlsafe: {base64.urlsafe_b64encode(raw).decode().rstrip('=')}", flush=True)
        print(f"{scope} hex: {raw.hex()}", flush=True)
        print(f"{scope} url: {urllib.parse.quote(token, safe='')}", flush=True)
        print(f"{scope} json: {json.dumps({'authorization': token})}", flush=True)
        half = len(token) // 2
        sys.stdout.write(f"{scope} two writes: {token[:half]}")
        sys.stdout.flush()
        sys.stdout.write(f"{token[half:]}\n")
        print(f"{scope} two lines: {token[:half]}\n{token[half:]}", flush=True)


def resume_from(checkpoint: Path | None) -> int:
    """Steps already rendered, by the checkpoint this attempt started from (0: none)."""
    if checkpoint is None:
        return 0
    try:
        doc = json.loads((checkpoint / "progress.json").read_text(encoding="utf-8"))
        return max(0, min(int(doc["done"]), PROGRESS_STEPS))
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def keep_progress(checkpoint: Path, done: int, attempt_id: str) -> None:
    tmp = checkpoint / ".progress.json"
    tmp.write_text(json.dumps({"done": done, "by_attempt": attempt_id}), encoding="utf-8")
    os.replace(tmp, checkpoint / "progress.json")


if __name__ == "__main__":
    sys.exit(main())
