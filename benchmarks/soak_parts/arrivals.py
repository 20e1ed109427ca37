"""A steady arrival of short episodes and films for several workspaces, submitted through
the client library (``gpufleet.client``) as a product backend would: every submit has its
own request id and is retried with the same one until the scheduler answers (it may be
down, restarting, or without its database), so a retry can never make a second job."""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field

from gpufleet.client import Client, GpufleetApiError


@dataclass
class Submitted:
    job_id: str
    workspace: str
    kind: str
    duration_s: float  # the control plane's seconds the job renders for
    at: float


@dataclass
class Arrivals:
    client: Client
    rng: random.Random
    workspaces: list[str]
    every_s: float  # real seconds between two arrivals, on average
    film_share: float = 0.15
    short_s: tuple[float, float] = (120.0, 420.0)
    film_s: tuple[float, float] = (600.0, 1200.0)
    jobs: dict[str, Submitted] = field(default_factory=dict)
    submit_retries: int = 0
    given_up: int = 0
    slowest_s: float = 0.0  # the longest a submit took, retries included (real seconds)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="arrivals", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def ours(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self.jobs

    def _loop(self) -> None:
        while not self._stop.wait(self.rng.expovariate(1.0 / self.every_s)):
            film = self.rng.random() < self.film_share
            kind = "film" if film else "short_episode"
            duration = self.rng.uniform(*(self.film_s if film else self.short_s))
            self.submit(self.rng.choice(self.workspaces), kind, duration)

    def submit(self, workspace: str, kind: str, duration_s: float) -> None:
        request_id = f"soak-{uuid.uuid4()}"
        values = {"duration_s": f"{duration_s:.0f}", "exit_code": "0"}
        began = time.monotonic()
        deadline = began + 120.0
        while True:
            try:
                job = self.client.submit_job(workspace, kind, tenant_values=values, request_id=request_id)
                break
            except GpufleetApiError:
                if time.monotonic() > deadline or self._stop.is_set():
                    self.given_up += 1
                    return
                self.submit_retries += 1
                time.sleep(1.0)
        self.slowest_s = max(self.slowest_s, time.monotonic() - began)
        with self._lock:
            self.jobs[job.job_id] = Submitted(job.job_id, workspace, kind, duration_s, time.time())
