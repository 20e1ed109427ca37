"""The machines' own process tables: which attempts' job processes are alive, sampled at
2 Hz from /proc, so two attempts of one job alive at one instant are seen however the
control plane's records read.

A job process is any process whose environment names ``GPUFLEET_JOB_SPEC`` (the runner
gives it to the job, its children inherit it); its spec — read through the process's own
root, since a job runs behind walls — names its job and attempt. Only the soak's own jobs
count (other engineers' tests run jobs on this host too).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Overlap:
    """One sample in which more than one attempt of a job had a live process."""

    at: float
    job_id: str
    attempts: tuple[str, ...]


@dataclass
class JobProcessSampler:
    ours: Callable[[str], bool]  # is this job id one the soak submitted?
    every_s: float = 0.5
    samples: int = 0
    overlaps: list[Overlap] = field(default_factory=list)
    # attempt id -> (first seen, last seen) alive, real time
    seen: dict[str, tuple[float, float]] = field(default_factory=dict)
    attempt_job: dict[str, str] = field(default_factory=dict)
    last_alive: set[str] = field(default_factory=set)  # attempts alive in the latest sample
    _cache: dict[tuple[int, str], tuple[str, str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="job-process-sampler", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def sample(self) -> dict[str, set[str]]:
        """job id -> the attempts with a live job process now."""
        now = time.time()
        alive: dict[str, set[str]] = {}
        live_keys = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            found = self._identify(proc)
            if found is None:
                continue
            key, ids = found
            live_keys.add(key)
            job_id, attempt_id = ids
            alive.setdefault(job_id, set()).add(attempt_id)
            first, _ = self.seen.get(attempt_id, (now, now))
            self.seen[attempt_id] = (first, now)
            self.attempt_job[attempt_id] = job_id
        self._cache = {k: v for k, v in self._cache.items() if k in live_keys}
        for job_id, attempts in alive.items():
            if len(attempts) > 1:
                self.overlaps.append(Overlap(now, job_id, tuple(sorted(attempts))))
        self.samples += 1
        self.last_alive = {a for attempts in alive.values() for a in attempts}
        return alive

    def _identify(self, proc: Path) -> tuple[tuple[int, str], tuple[str, str]] | None:
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[-1].split()
        if not fields or fields[0] == "Z":
            return None  # a zombie runs nothing
        key = (int(proc.name), fields[19])  # pid and start time: a reused pid is another process
        if key in self._cache:
            return key, self._cache[key]
        ids = self._read_spec(proc)
        if ids is None or not ids[0] or not self.ours(ids[0]):
            # Read again next time: a process forked by a runner may exec its job after this
            # sample, keeping its pid and start time.
            return None
        self._cache[key] = ids
        return key, ids

    def _read_spec(self, proc: Path) -> tuple[str, str] | None:
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            return None
        spec_path = next(
            (e[len(b"GPUFLEET_JOB_SPEC=") :] for e in environ if e.startswith(b"GPUFLEET_JOB_SPEC=")), None
        )
        if not spec_path:
            return None
        try:
            spec = json.loads((proc / "root" / spec_path.decode().lstrip("/")).read_text())
        except (OSError, ValueError):
            return "", ""  # a job process whose spec cannot be read now: read again next time
        job_id, attempt_id = str(spec.get("job_id", "")), str(spec.get("attempt_id", ""))
        return job_id, attempt_id
