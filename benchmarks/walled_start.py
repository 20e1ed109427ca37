"""What the walls cost a job's start: a walled slot against a plain spawn of the same command.

    .venv/bin/python benchmarks/walled_start.py [--runs 20] [--json]

Run as root on a machine where the walls can be built (bubblewrap installed). Each run
times, in the same process and on the same machine, (a) a plain ``subprocess.run`` of
``/usr/bin/python3 -I -c pass`` and (b) opening a walled slot (wipe, cgroup, folders), running the
same command behind bubblewrap as the slot's user, and closing the slot (kill, wipe,
remove). It prints the medians and the extra milliseconds and ratio; the goal is at most
150 ms extra at the median. It uses its own walls root, slot users ``gfbench-s*``, and no
network.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from gpufleet.agent.specs import JobSpec
from gpufleet.agent.walls.setup import scratch_walls

COMMAND = ["/usr/bin/python3", "-I", "-c", "pass"]  # the same binary inside and out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with scratch_walls("bench", 1) as (root, launcher, state):
        pipeline = root / "pipeline"
        pipeline.mkdir(mode=0o755)
        plain, walled = [], []
        for run in range(args.runs):
            started = time.perf_counter()
            subprocess.run(COMMAND, check=True)
            plain.append(time.perf_counter() - started)

            spec = JobSpec(attempt_id=f"bench-{run}", job_id="bench", slot=0)
            files = state.attempt(spec.attempt_id)
            files.folder.mkdir(parents=True)
            started = time.perf_counter()
            slot = launcher.open_slot(spec, files, pipeline)
            subprocess.run(
                slot.command(COMMAND),
                env=slot.environment({}),
                cwd=slot.job_dir,
                preexec_fn=slot.preexec(),
                check=True,
            )
            slot.close()
            walled.append(time.perf_counter() - started)
            print(f"\rrun {run + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    plain_ms, walled_ms = statistics.median(plain) * 1000, statistics.median(walled) * 1000
    figures = {
        "runs": args.runs,
        "plain_spawn_p50_ms": round(plain_ms, 1),
        "walled_p50_ms": round(walled_ms, 1),
        "extra_p50_ms": round(walled_ms - plain_ms, 1),
        "ratio": round(walled_ms / plain_ms, 2),
        "goal_extra_ms": 150,
    }
    print(f"{'':30}{'p50 ms':>10}")
    print(f"{'plain spawn':30}{plain_ms:10.1f}")
    print(f"{'walled slot (open+run+close)':30}{walled_ms:10.1f}")
    extra, ratio = walled_ms - plain_ms, walled_ms / plain_ms
    print(f"extra {extra:.1f} ms at the median, {ratio:.2f}x a plain spawn (goal <= 150 ms)")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
