"""The hub that feeds every WatchJob stream from one query a poll.

Each stream registers its job with the hub and waits on an asyncio queue; the hub, one
task on the server's event loop, reads the job events written since each watched job's
cursor (one query, in a small executor) and hands each to its job's queues. A stream
therefore costs no thread and no query of its own while it waits, and two hundred
streams cost what one does.

Why a cursor per job, and what makes it safe. An event's id (its ``sequence``) is taken
from the sequence when its row is inserted, before its transaction commits, so two
transactions can commit ids out of order: one global "greatest id seen" would step over
a smaller id that commits a moment later, and that event would never be streamed. Within
one job that cannot happen: every writer of a job's events first writes (or locks with
FOR UPDATE) the job's own row and holds that lock until it commits — the job writer's
``set_job_state`` and ``move_jobs`` update the row in the same flush (the ORM writes ``jobs`` before
``job_events``, its child table), the fleet tick's pending-reason and dispatch writes
update or lock the rows before inserting, and SubmitJob's first event is inserted with
the row itself. So a job's next event takes its id only after the previous one's
transaction ended: per job, ids commit in increasing order, and once an event of a job
is visible every smaller one of that job is too. A cursor per job (the greatest id read
for it) therefore never skips one; the same rule makes a client's ``after_sequence`` an
exact resume point. tests/integration/scheduler/test_watch_resume.py holds both.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.outage import describe, is_outage

log = logging.getLogger(__name__)

Event = tuple[int, str, datetime, str]
# Watched jobs per query (two bound values each).
CHUNK = 500


class EventHub:
    def __init__(self, sessions: sessionmaker[Session], poll_s: float, workers: int = 4) -> None:
        self.sessions = sessions
        self.poll_s = poll_s
        self.executor = ThreadPoolExecutor(workers, thread_name_prefix="watch")
        self._queues: dict[str, set[asyncio.Queue[Event]]] = {}
        # Per watched job, the greatest event id read for it (see the module's docstring).
        self._cursors: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, job_id: str) -> asyncio.Queue[Event]:
        """A queue that receives ``job_id``'s events from now on (on the event loop).

        Every event committed after this call reaches the queue; some earlier ones may too
        (a job newly watched is read from its first event), so a stream that also reads
        the job's past after calling this misses none and drops the repeats by id."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._queues.setdefault(job_id, set()).add(queue)
        self._cursors.setdefault(job_id, 0)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return queue

    def unwatch(self, job_id: str, queue: asyncio.Queue[Event]) -> None:
        queues = self._queues.get(job_id)
        if queues is not None:
            queues.discard(queue)
            if not queues:
                del self._queues[job_id]
                self._cursors.pop(job_id, None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queues:
            try:
                events = await loop.run_in_executor(self.executor, self._since, list(self._cursors.items()))
            except Exception as exc:
                if is_outage(exc):  # a known condition: one line, no stack; the streams wait
                    log.warning("WatchJob hub: the database is unavailable (%s); retrying", describe(exc))
                else:
                    log.exception("WatchJob hub: reading job events failed; retrying")
                events = []
            for job_id, event in events:
                if job_id in self._cursors:
                    self._cursors[job_id] = max(self._cursors[job_id], event[0])
                for queue in self._queues.get(job_id, ()):
                    queue.put_nowait(event)
            await asyncio.sleep(self.poll_s)

    def _since(self, cursors: list[tuple[str, int]]) -> list[tuple[str, Event]]:
        """The events after each job's cursor, oldest first."""
        E = models.JobEvent
        out: list[tuple[str, Event]] = []
        with self.sessions() as session:
            for i in range(0, len(cursors), CHUNK):
                after = or_(
                    *(and_(E.job_id == job_id, E.id > cursor) for job_id, cursor in cursors[i : i + CHUNK])
                )
                rows = session.execute(
                    select(E.id, E.job_id, E.state, E.at, E.message).where(after).order_by(E.id)
                ).all()
                out.extend((r.job_id, (r.id, r.state, r.at, r.message)) for r in rows)
        out.sort(key=lambda item: item[1][0])
        return out
