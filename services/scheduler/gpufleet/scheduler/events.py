"""The hub that feeds every WatchJob stream from one query a poll.

Each stream registers its job with the hub and waits on an asyncio queue; the hub, one
task on the server's event loop, reads the job events written since its cursor for the
jobs being watched (one query, in a small executor) and hands each to its job's queues. A
stream therefore costs no thread and no query of its own while it waits, and two hundred
streams cost what one does.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models

log = logging.getLogger(__name__)

Event = tuple[int, str, datetime, str]
# Job ids per query's IN list.
CHUNK = 1000


class EventHub:
    def __init__(self, sessions: sessionmaker[Session], poll_s: float, workers: int = 4) -> None:
        self.sessions = sessions
        self.poll_s = poll_s
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="watch")
        self._queues: dict[str, set[asyncio.Queue[Event]]] = {}
        self._cursor: int | None = None
        self._task: asyncio.Task[None] | None = None

    def watch(self, job_id: str) -> asyncio.Queue[Event]:
        """A queue that receives ``job_id``'s events from now on (on the event loop)."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues.setdefault(job_id, set()).add(queue)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return queue

    def unwatch(self, job_id: str, queue: asyncio.Queue[Event]) -> None:
        queues = self._queues.get(job_id)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self._queues[job_id]

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._cursor is None:
            self._cursor = await loop.run_in_executor(self.executor, self._last_id)
        while self._queues:
            try:
                events = await loop.run_in_executor(
                    self.executor, self._since, self._cursor, list(self._queues)
                )
            except Exception:
                log.exception("WatchJob hub: reading job events failed; retrying")
                events = []
            for job_id, event in events:
                self._cursor = max(self._cursor, event[0])
                for queue in self._queues.get(job_id, ()):
                    queue.put_nowait(event)
            await asyncio.sleep(self.poll_s)

    def _last_id(self) -> int:
        with self.sessions() as session:
            return int(session.execute(select(func.max(models.JobEvent.id))).scalar() or 0)

    def _since(self, cursor: int, job_ids: list[str]) -> list[tuple[str, Event]]:
        E = models.JobEvent
        out: list[tuple[str, Event]] = []
        with self.sessions() as session:
            for i in range(0, len(job_ids), CHUNK):
                rows = session.execute(
                    select(E.id, E.job_id, E.state, E.at, E.message)
                    .where(E.id > cursor, E.job_id.in_(job_ids[i : i + CHUNK]))
                    .order_by(E.id)
                ).all()
                out.extend((r.job_id, (r.id, r.state, r.at, r.message)) for r in rows)
        out.sort(key=lambda item: item[1][0])
        return out
