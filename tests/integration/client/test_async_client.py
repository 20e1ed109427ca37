"""The asyncio client's main path against a real scheduler process (real mutual TLS, real
PostgreSQL): a workspace, an idempotent submit, paged lists, the typed error naming every
bad field, and a watch that outlives a crash and restart of the scheduler."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpufleet.client import AsyncClient, InvalidArgument
from gpufleet.v1 import job_pb2
from tests.integration.client.conftest import Scheduler
from tests.integration.client.test_sync_client import BAD_SUBMIT_FIELDS


def test_the_asyncio_client_submits_lists_and_reports_bad_fields(
    scheduler: Scheduler, backend_certs: Path
) -> None:
    async def main() -> None:
        async with AsyncClient(scheduler.address, backend_certs) as fleet:
            await fleet.create_workspace("studio-7", "studio")
            first = await fleet.submit_job("studio-7", "clip", request_id="order-42")
            again = await fleet.submit_job("studio-7", "clip", request_id="order-42")
            assert again.job_id == first.job_id
            more = [(await fleet.submit_job("studio-7", "clip")).job_id for _ in range(4)]

            listed = [j.job_id async for j in fleet.list_jobs(workspace="studio-7", page_size=2)]
            assert listed == [first.job_id, *more]
            kinds = [k.kind_id async for k in fleet.list_job_kinds(page_size=1)]
            assert kinds == ["clip", "film", "short_episode"]
            assert (await fleet.get_job(more[0])).state == job_pb2.JOB_STATE_QUEUED

            with pytest.raises(InvalidArgument) as bad:
                await fleet.submit_job(
                    "",
                    "",
                    pool="Not A Pool!",
                    pipeline_version="1.0; rm -rf /",
                    tenant_values={"bad key!": "v", "huge": "x" * 10_000},
                    request_id="has spaces",
                )
            assert [(v.field, v.reason) for v in bad.value.violations] == BAD_SUBMIT_FIELDS

    asyncio.run(main())


def test_an_async_watch_survives_a_scheduler_crash(scheduler: Scheduler, backend_certs: Path) -> None:
    async def main() -> list[job_pb2.JobEvent]:
        async with AsyncClient(scheduler.address, backend_certs) as fleet:
            await fleet.create_workspace("studio-1", "studio")
            job = await fleet.submit_job("studio-1", "clip")
            seen: list[job_pb2.JobEvent] = []
            first = asyncio.Event()

            async def follow() -> None:
                async for event in fleet.watch_job(job.job_id):
                    seen.append(event)
                    first.set()

            watcher = asyncio.create_task(follow())
            await asyncio.wait_for(first.wait(), 30)
            before = len(seen)

            # A crash: the process is killed, its connections cut at once.
            await asyncio.to_thread(scheduler.process.kill)
            await asyncio.to_thread(scheduler.start_again)
            await fleet.cancel_job(job.job_id)
            await asyncio.wait_for(watcher, 60)

            assert len(seen) > before
            # Exactly the job's history, as a watch opened now (after the end) tells it.
            replay = [e async for e in fleet.watch_job(job.job_id)]

            def told(events: list[job_pb2.JobEvent]) -> list[tuple[int, int, str]]:
                return [(e.sequence, e.state, e.message) for e in events]

            assert told(seen) == told(replay)
            return seen

    seen = asyncio.run(main())
    sequences = [e.sequence for e in seen]
    # Resumed after the last event given: strictly increasing, so none given twice.
    assert sequences == sorted(set(sequences)) and sequences[0] > 0, "an event was given twice"
    assert seen[-1].state == job_pb2.JOB_STATE_CANCELLED
