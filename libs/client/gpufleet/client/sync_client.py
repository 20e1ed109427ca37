"""The blocking client: one channel to the scheduler, typed methods for JobService,
WorkspaceService and the catalogue's reads.

Every unary call has a deadline (the client's default unless the call names one) and is
retried by gRPC's own retry policy when it is safe to repeat (:mod:`.service_config`); a
failure is raised as a typed :class:`~gpufleet.client.errors.GpufleetApiError`. Answers are
the generated ``gpufleet.v1`` messages, whose fields the protos document.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import grpc

from gpufleet.client import errors, paging, requests
from gpufleet.client.certificates import CHECK_EVERY_S
from gpufleet.client.channels import Generation, SyncChannels
from gpufleet.client.connection import Connection, Deadlines
from gpufleet.client.watch_resume import WatchResume
from gpufleet.v1 import catalog_pb2, job_pb2, job_service_pb2, workspace_service_pb2


class Client:
    """A client of one deployment's scheduler, as the role its certificate proves.

    ``certs`` is the folder ``gpufleet certs issue --role backend --out DIR`` wrote; the
    scheduler must prove ``scheduler.gpufleet.<deployment>``, the deployment being the
    certificate's own unless ``deployment`` names it. ``timeout`` is every unary call's
    deadline in seconds; a watch's streams get ``watch_stream_timeout`` each, and a lost
    one is reopened for up to ``watch_reconnect_within`` seconds.

    The certificate folder is followed: when its files change (a renewed certificate, key or
    trust bundle), the next call opens a new channel with them, calls already going on
    finish on the old one, which is then closed (:mod:`.channels`). ``certs_check_interval``
    is how often, at most, the files are looked at (seconds).
    """

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

        def open_channel(credentials: grpc.ChannelCredentials | None) -> grpc.Channel:
            if credentials is None:
                return grpc.insecure_channel(conn.address, options=conn.options)
            return grpc.secure_channel(conn.address, credentials, options=conn.options)

        self.channels = SyncChannels(conn, open_channel)

    @property
    def channel(self) -> grpc.Channel:
        """The channel in force now. A call made on it directly is not waited for when the
        files change: it may be closed under that call."""
        return self.channels.current.channel

    def close(self) -> None:
        """Close every channel (calls still going on are cancelled)."""
        self.channels.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _unary(
        self, method: Callable[[Generation[grpc.Channel]], Any], request: Any, timeout: float | None
    ) -> Any:
        with self.channels.use() as on:
            try:
                return method(on)(request, timeout=self.deadlines.call if timeout is None else timeout)
            except grpc.RpcError as err:
                raise errors.from_rpc_error(err) from err

    # JobService

    def submit_job(
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
        """Submit one job; the same job comes back however often the call is retried.

        ``request_id`` is made up when left out, once for this call and sent unchanged by
        every retry of it; name your own to make a submit idempotent across calls (a
        process that may crash and submit again). ``pool`` and ``pipeline_version`` left
        out take the kind's catalogue defaults."""
        request = requests.submit_job(
            workspace,
            kind,
            pool=pool,
            pipeline_version=pipeline_version,
            tenant_values=tenant_values,
            request_id=request_id,
        )
        job: job_pb2.Job = self._unary(lambda on: on.jobs.SubmitJob, request, timeout)
        return job

    def get_job(self, job_id: str, *, timeout: float | None = None) -> job_pb2.Job:
        """One job with its attempts (``job_id`` or ``jobs/{id}``)."""
        job: job_pb2.Job = self._unary(lambda on: on.jobs.GetJob, requests.get_job(job_id), timeout)
        return job

    def list_jobs(
        self,
        *,
        workspace: str | None = None,
        state: job_pb2.JobState | None = None,
        pool: str | None = None,
        page_size: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[job_pb2.Job]:
        """Every job that matches, oldest first, fetched a page at a time as the loop goes
        (without attempts); ``timeout`` is each page's deadline."""

        def fetch(token: str) -> tuple[Sequence[job_pb2.Job], str]:
            request = requests.list_jobs(
                workspace=workspace, state=state, pool=pool, page_size=page_size, page_token=token
            )
            reply: job_service_pb2.ListJobsResponse = self._unary(
                lambda on: on.jobs.ListJobs, request, timeout
            )
            return reply.jobs, reply.next_page_token

        return paging.items(fetch)

    def cancel_job(
        self, job_id: str, *, reason: str = "", request_id: str | None = None, timeout: float | None = None
    ) -> job_pb2.Job:
        """Cancel a job (idempotent: a cancelled job is answered as it is)."""
        request = requests.cancel_job(job_id, reason=reason, request_id=request_id)
        job: job_pb2.Job = self._unary(lambda on: on.jobs.CancelJob, request, timeout)
        return job

    def watch_job(self, job_id: str) -> Iterator[job_pb2.JobEvent]:
        """The job's state changes, its past ones first, until it ends.

        A stream lost to a scheduler restart or a cut connection is reopened (waiting up to
        ``watch_reconnect_within`` seconds for the scheduler) after the last event it gave
        (``after_sequence``), so no event is given twice or missed (:mod:`.watch_resume`).
        Leaving the loop early cancels the stream."""
        resume = WatchResume(self.deadlines.watch_reconnect_within)
        while True:
            request = requests.watch_job(job_id, after_sequence=resume.after_sequence)
            # Each stream goes on the channel in force when it opens, and keeps it to its end.
            with self.channels.use() as on:
                call = on.jobs.WatchJob(request, timeout=self.deadlines.watch_stream)
                try:
                    for event in call:
                        if resume.heard(event):
                            yield event
                        if resume.ended:
                            return
                    return  # the server ended the stream without a final state: nothing more comes
                except grpc.RpcError as err:
                    error = errors.from_rpc_error(err)
                    pause = resume.cut(error)
                    if pause is None:
                        raise error from err
                finally:
                    call.cancel()
            # Real time: a back-off between two tries to reach the scheduler, not logic.
            time.sleep(pause)
            with self.channels.use() as on:
                try:
                    grpc.channel_ready_future(on.channel).result(timeout=resume.time_left())
                except grpc.FutureTimeoutError:
                    raise error from None

    def get_job_log(
        self,
        job_id: str,
        *,
        attempt_id: str | None = None,
        offset: int = 0,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> job_service_pb2.GetJobLogResponse:
        """One page of an attempt's log (the newest attempt's unless named), from ``offset``."""
        request = requests.get_job_log(job_id, attempt_id=attempt_id, offset=offset, max_bytes=max_bytes)
        page: job_service_pb2.GetJobLogResponse = self._unary(lambda on: on.jobs.GetJobLog, request, timeout)
        return page

    def read_job_log(
        self,
        job_id: str,
        *,
        attempt_id: str | None = None,
        offset: int = 0,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> Iterator[job_service_pb2.GetJobLogResponse]:
        """Pages (of at most ``max_bytes``) of one attempt's log from ``offset`` to its end
        so far; the attempt is the first page's, so a retry starting meanwhile does not
        splice two logs."""
        while True:
            page = self.get_job_log(
                job_id, attempt_id=attempt_id, offset=offset, max_bytes=max_bytes, timeout=timeout
            )
            yield page
            if page.end_of_log:
                return
            attempt_id, offset = page.attempt_id, page.next_offset

    # WorkspaceService

    def create_workspace(
        self,
        workspace_id: str,
        plan: str,
        *,
        paused: bool = False,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> catalog_pb2.Workspace:
        """Create a workspace on ``plan``; idempotent by ``request_id`` (made up when left
        out, the same for every retry of this call)."""
        request = requests.create_workspace(workspace_id, plan, paused=paused, request_id=request_id)
        workspace: catalog_pb2.Workspace = self._unary(
            lambda on: on.workspaces.CreateWorkspace, request, timeout
        )
        return workspace

    def get_workspace(self, workspace_id: str, *, timeout: float | None = None) -> catalog_pb2.Workspace:
        request = requests.get_workspace(workspace_id)
        workspace: catalog_pb2.Workspace = self._unary(
            lambda on: on.workspaces.GetWorkspace, request, timeout
        )
        return workspace

    def list_workspaces(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> Iterator[catalog_pb2.Workspace]:
        """Every workspace, ordered by id, a page at a time."""

        def fetch(token: str) -> tuple[Sequence[catalog_pb2.Workspace], str]:
            request = requests.list_workspaces(page_size=page_size, page_token=token)
            reply: catalog_pb2.ListWorkspacesResponse = self._unary(
                lambda on: on.workspaces.ListWorkspaces, request, timeout
            )
            return reply.workspaces, reply.next_page_token

        return paging.items(fetch)

    def update_workspace(
        self,
        workspace_id: str,
        *,
        plan: str | None = None,
        active: bool | None = None,
        request_id: str | None = None,
        timeout: float | None = None,
    ) -> catalog_pb2.Workspace:
        """Change what is given: ``plan``, and/or ``active`` (False pauses the workspace:
        its queued jobs wait, its running ones finish; True resumes it)."""
        request = requests.update_workspace(workspace_id, plan=plan, active=active, request_id=request_id)
        workspace: catalog_pb2.Workspace = self._unary(
            lambda on: on.workspaces.UpdateWorkspace, request, timeout
        )
        return workspace

    def get_usage(
        self,
        workspace_id: str,
        start: datetime,
        end: datetime | None = None,
        *,
        timeout: float | None = None,
    ) -> workspace_service_pb2.Usage:
        """Slot-seconds, GPU-hours and charges of the attempts that ended in [start, end)
        (``end`` left out: now), in all, by kind and by UTC day."""
        request = requests.get_usage(workspace_id, start=start, end=end)
        usage: workspace_service_pb2.Usage = self._unary(lambda on: on.workspaces.GetUsage, request, timeout)
        return usage

    # CatalogService

    def list_pools(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> Iterator[catalog_pb2.Pool]:
        """Every pool with its offerings, ordered by id."""

        def fetch(token: str) -> tuple[Sequence[catalog_pb2.Pool], str]:
            request = requests.list_pools(page_size=page_size, page_token=token)
            reply = self._unary(lambda on: on.catalogue.ListPools, request, timeout)
            return reply.pools, reply.next_page_token

        return paging.items(fetch)

    def list_job_kinds(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> Iterator[catalog_pb2.JobKind]:
        """Every job kind, ordered by id, with the defaults SubmitJob fills in."""

        def fetch(token: str) -> tuple[Sequence[catalog_pb2.JobKind], str]:
            request = requests.list_job_kinds(page_size=page_size, page_token=token)
            reply = self._unary(lambda on: on.catalogue.ListJobKinds, request, timeout)
            return reply.job_kinds, reply.next_page_token

        return paging.items(fetch)

    def list_plans(
        self, *, page_size: int | None = None, timeout: float | None = None
    ) -> Iterator[catalog_pb2.Plan]:
        """Every plan, ordered by id."""

        def fetch(token: str) -> tuple[Sequence[catalog_pb2.Plan], str]:
            request = requests.list_plans(page_size=page_size, page_token=token)
            reply = self._unary(lambda on: on.catalogue.ListPlans, request, timeout)
            return reply.plans, reply.next_page_token

        return paging.items(fetch)
