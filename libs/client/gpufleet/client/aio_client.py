"""The asyncio client (grpc.aio): the same methods as :class:`~gpufleet.client.Client`, to
be awaited, its lists and watches async iterators.

It shares the sync client's requests (:mod:`.requests`), channel options and retry policy
(:mod:`.connection`, :mod:`.service_config`), paging rule and watch resumption
(:mod:`.watch_resume`); only the waiting differs. Open and use it inside one event loop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from gpufleet.client import errors, paging, requests
from gpufleet.client.certificates import CHECK_EVERY_S
from gpufleet.client.channels import AsyncChannels, Generation
from gpufleet.client.connection import Connection, Deadlines
from gpufleet.client.watch_resume import WatchResume
from gpufleet.v1 import catalog_pb2, job_pb2, job_service_pb2, workspace_service_pb2


class AsyncClient:
    """See :class:`~gpufleet.client.Client` for the arguments (the certificate folder is
    followed the same way); ``async with`` closes it."""

    def __init__(
        self,
        address: str,
        certs: str | os.PathLike[str] | None = None,
        *,
        deployment: str | None = None,
        insecure: bool = False,
        timeout: float = Deadlines.call,
        watch_stream_timeout: float = Deadlines.watch_stream,
        watch_reconnect_within: float = Deadlines.watch_reconnect_within,
        options: list[tuple[str, Any]] | None = None,
        certs_check_interval: float = CHECK_EVERY_S,
    ) -> None:
        conn = Connection.of(
            address,
            certs,
            deployment=deployment,
            insecure=insecure,
            options=options,
            certs_check_interval=certs_check_interval,
        )
        self.deadlines = Deadlines(timeout, watch_stream_timeout, watch_reconnect_within)

        def open_channel(credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
            if credentials is None:
                return grpc.aio.insecure_channel(conn.address, options=conn.options)
            return grpc.aio.secure_channel(conn.address, credentials, options=conn.options)

        self.channels = AsyncChannels(conn, open_channel)

    @property
    def channel(self) -> grpc.aio.Channel:
        """The channel in force now (see :attr:`Client.channel`)."""
        return self.channels.current.channel

    async def close(self) -> None:
        await self.channels.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def _unary(
        self, method: Callable[[Generation[grpc.aio.Channel]], Any], request: Any, timeout: float | None
    ) -> Any:
        async with self.channels.use() as on:
            try:
                return await method(on)(request, timeout=self.deadlines.call if timeout is None else timeout)
            except grpc.RpcError as err:
                raise errors.from_rpc_error(err) from err

    # JobService

    async def submit_job(
        self,
        workspace: str,
        kind: str,
        *,
        pool: str | None = None,
        pipeline_version: str | None = None,
        tenant_values: Mapping[str, str] | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> job_pb2.Job:
        """Submit one job; see :meth:`Client.submit_job` for the idempotency key."""
        request = requests.submit_job(
            workspace,
            kind,
            pool=pool,
            pipeline_version=pipeline_version,
            tenant_values=tenant_values,
            request_id=request_id,
        )
        job: job_pb2.Job = await self._unary(lambda on: on.jobs.SubmitJob, request, timeout)
        return job

    async def get_job(self, job_id: str, *, timeout: float | None = None) -> job_pb2.Job:
        job: job_pb2.Job = await self._unary(lambda on: on.jobs.GetJob, requests.get_job(job_id), timeout)
        return job

    def list_jobs(
        self,
        *,
        workspace: str | None = None,
        state: job_pb2.JobState | None = None,
        pool: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[job_pb2.Job]:
        """Every job that matches, oldest first (``async for``), a page at a time."""

        async def fetch(token: str) -> tuple[Sequence[job_pb2.Job], str]:
            request = requests.list_jobs(
                workspace=workspace, state=state, pool=pool, page_size=page_size, page_token=token
            )
            reply: job_service_pb2.ListJobsResponse = await self._unary(
                lambda on: on.jobs.ListJobs, request, timeout
            )
            return reply.jobs, reply.next_page_token

        return paging.aitems(fetch)

    async def cancel_job(
        self, job_id: str, *, reason: str = "", request_id: str | None = None, timeout: float | None = None
    ) -> job_pb2.Job:
        request = requests.cancel_job(job_id, reason=reason, request_id=request_id)
        job: job_pb2.Job = await self._unary(lambda on: on.jobs.CancelJob, request, timeout)
        return job

    async def watch_job(self, job_id: str) -> AsyncIterator[job_pb2.JobEvent]:
        """The job's state changes until it ends, reopened across a lost stream without
        repeating an event (see :meth:`Client.watch_job`)."""
        resume = WatchResume(self.deadlines.watch_reconnect_within)
        while True:
            request = requests.watch_job(job_id, after_sequence=resume.after_sequence)
            # Each stream goes on the channel in force when it opens, and keeps it to its end.
            async with self.channels.use() as on:
                call = on.jobs.WatchJob(request, timeout=self.deadlines.watch_stream)
                try:
                    async for event in call:
                        if resume.heard(event):
                            yield event
                        if resume.ended:
                            return
                    return
                except grpc.RpcError as err:
                    error = errors.from_rpc_error(err)
                    pause = resume.cut(error)
                    if pause is None:
                        raise error from err
                finally:
                    call.cancel()
            await asyncio.sleep(pause)
            async with self.channels.use() as on:
                try:
                    await asyncio.wait_for(on.channel.channel_ready(), timeout=resume.time_left())
                except TimeoutError:
                    raise error from None

    async def get_job_log(
        self,
        job_id: str,
        *,
        attempt_id: str | None = None,
        offset: int = 0,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> job_service_pb2.GetJobLogResponse:
        request = requests.get_job_log(job_id, attempt_id=attempt_id, offset=offset, max_bytes=max_bytes)
        page: job_service_pb2.GetJobLogResponse = await self._unary(
            lambda on: on.jobs.GetJobLog, request, timeout
        )
        return page

    async def read_job_log(
        self,
        job_id: str,
        *,
        attempt_id: str | None = None,
        offset: int = 0,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[job_service_pb2.GetJobLogResponse]:
        """Pages of one attempt's log to its end so far (see :meth:`Client.read_job_log`)."""
        while True:
            page = await self.get_job_log(
                job_id, attempt_id=attempt_id, offset=offset, max_bytes=max_bytes, timeout=timeout
            )
            yield page
            if page.end_of_log:
                return
            attempt_id, offset = page.attempt_id, page.next_offset

    # WorkspaceService

    async def create_workspace(
        self,
        workspace_id: str,
        plan: str,
        *,
        paused: bool = False,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> catalog_pb2.Workspace:
        request = requests.create_workspace(workspace_id, plan, paused=paused, request_id=request_id)
        workspace: catalog_pb2.Workspace = await self._unary(
            lambda on: on.workspaces.CreateWorkspace, request, timeout
        )
        return workspace

    async def get_workspace(
        self, workspace_id: str, *, timeout: float | None = None
    ) -> catalog_pb2.Workspace:
        request = requests.get_workspace(workspace_id)
        workspace: catalog_pb2.Workspace = await self._unary(
            lambda on: on.workspaces.GetWorkspace, request, timeout
        )
        return workspace

    def list_workspaces(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[catalog_pb2.Workspace]:
        async def fetch(token: str) -> tuple[Sequence[catalog_pb2.Workspace], str]:
            request = requests.list_workspaces(page_size=page_size, page_token=token)
            reply: catalog_pb2.ListWorkspacesResponse = await self._unary(
                lambda on: on.workspaces.ListWorkspaces, request, timeout
            )
            return reply.workspaces, reply.next_page_token

        return paging.aitems(fetch)

    async def update_workspace(
        self,
        workspace_id: str,
        *,
        plan: str | None = None,
        active: bool | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> catalog_pb2.Workspace:
        request = requests.update_workspace(workspace_id, plan=plan, active=active, request_id=request_id)
        workspace: catalog_pb2.Workspace = await self._unary(
            lambda on: on.workspaces.UpdateWorkspace, request, timeout
        )
        return workspace

    async def get_usage(
        self,
        workspace_id: str,
        start: datetime,
        end: datetime | None = None,
        *,
        timeout: float | None = None,
    ) -> workspace_service_pb2.Usage:
        request = requests.get_usage(workspace_id, start=start, end=end)
        usage: workspace_service_pb2.Usage = await self._unary(
            lambda on: on.workspaces.GetUsage, request, timeout
        )
        return usage

    # CatalogService

    def list_pools(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[catalog_pb2.Pool]:
        async def fetch(token: str) -> tuple[Sequence[catalog_pb2.Pool], str]:
            request = requests.list_pools(page_size=page_size, page_token=token)
            reply = await self._unary(lambda on: on.catalogue.ListPools, request, timeout)
            return reply.pools, reply.next_page_token

        return paging.aitems(fetch)

    def list_job_kinds(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[catalog_pb2.JobKind]:
        async def fetch(token: str) -> tuple[Sequence[catalog_pb2.JobKind], str]:
            request = requests.list_job_kinds(page_size=page_size, page_token=token)
            reply = await self._unary(lambda on: on.catalogue.ListJobKinds, request, timeout)
            return reply.job_kinds, reply.next_page_token

        return paging.aitems(fetch)

    def list_plans(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[catalog_pb2.Plan]:
        async def fetch(token: str) -> tuple[Sequence[catalog_pb2.Plan], str]:
            request = requests.list_plans(page_size=page_size, page_token=token)
            reply = await self._unary(lambda on: on.catalogue.ListPlans, request, timeout)
            return reply.plans, reply.next_page_token

        return paging.aitems(fetch)
