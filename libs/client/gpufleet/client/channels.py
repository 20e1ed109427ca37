"""The channel a client's calls go on, opened again when its certificate files change.

gRPC for Python fixes a channel's credentials when the channel is made and reconnects with
them for the channel's whole life; a backend's client lives longer than its certificate,
which is renewed every few weeks (and a renewed trust bundle may be needed to check the
scheduler's renewed certificate). So each call first asks the certificate folder
(:class:`~gpufleet.client.certificates.CertificateWatch`, a few ``stat`` calls at most once a
second) whether it changed; when it did, a new channel is opened with the new files for
this call and the next ones. The channel in force before is retired: the calls already
going on it — a unary call waiting for its answer, a watch's open stream — finish on it,
and it is closed when the last of them ends (at once when none is going on). A watch whose
stream breaks later opens its next stream on the channel in force then.

:class:`Channels` is the bookkeeping, shared; :class:`SyncChannels` and
:class:`AsyncChannels` differ only in how a channel is closed.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from gpufleet.client.certificates import CertificateFolder
from gpufleet.client.connection import Connection
from gpufleet.v1 import catalog_service_pb2_grpc, job_service_pb2_grpc, workspace_service_pb2_grpc

C = TypeVar("C")  # grpc.Channel or grpc.aio.Channel


@dataclass(eq=False)
class Generation(Generic[C]):
    """One channel, its stubs, the certificate it was opened with, and how many calls are
    going on it now."""

    channel: C
    jobs: Any
    workspaces: Any
    catalogue: Any
    folder: CertificateFolder | None
    calls: int = 0
    retired: bool = False


class Channels(Generic[C]):
    """The generation in force, and the retired ones whose calls have not all ended."""

    def __init__(self, conn: Connection, open_channel: Callable[[grpc.ChannelCredentials | None], C]) -> None:
        self._conn = conn
        self._open_channel = open_channel
        self._lock = threading.Lock()
        self._closed = False
        self._current = self._open(self._folder())
        self._retired: list[Generation[C]] = []
        # How many channels were opened in all (1 + one for each change of the files taken).
        self.opened = 1

    def _folder(self) -> CertificateFolder | None:
        return None if self._conn.certificates is None else self._conn.certificates.current()

    def _open(self, folder: CertificateFolder | None) -> Generation[C]:
        channel = self._open_channel(None if folder is None else folder.channel_credentials())
        return Generation(
            channel,
            job_service_pb2_grpc.JobServiceStub(channel),
            workspace_service_pb2_grpc.WorkspaceServiceStub(channel),
            catalog_service_pb2_grpc.CatalogServiceStub(channel),
            folder,
        )

    @property
    def current(self) -> Generation[C]:
        """The generation in force (not counted as a call)."""
        return self._current

    @property
    def open_channels(self) -> int:
        """The channel in force and the retired ones still finishing calls."""
        with self._lock:
            return 1 + len(self._retired)

    def acquire(self) -> tuple[Generation[C], list[C]]:
        """The generation a call goes on, counted until :meth:`release`, made new when the
        files changed; and the retired channels to close now (none of their calls left)."""
        folder = self._folder()
        stale: list[C] = []
        with self._lock:
            if folder is not self._current.folder and not self._closed:
                old = self._current
                old.retired = True
                self._current = self._open(folder)
                self.opened += 1
                if old.calls:
                    self._retired.append(old)
                else:
                    stale.append(old.channel)
            generation = self._current
            generation.calls += 1
        return generation, stale

    def release(self, generation: Generation[C]) -> C | None:
        """A call on ``generation`` ended: its channel, when it is retired and that was its
        last call (to be closed)."""
        with self._lock:
            generation.calls -= 1
            if generation.retired and not generation.calls and generation in self._retired:
                self._retired.remove(generation)
                return generation.channel
        return None

    def close_all(self) -> list[C]:
        """Every channel, to be closed (calls still going on are cancelled)."""
        with self._lock:
            self._closed = True
            channels = [self._current.channel, *(g.channel for g in self._retired)]
            self._retired = []
        return channels


class SyncChannels(Channels[grpc.Channel]):
    @contextmanager
    def use(self) -> Iterator[Generation[grpc.Channel]]:
        """The generation for one call (or one stream), held until the block ends."""
        generation, stale = self.acquire()
        for channel in stale:
            channel.close()
        try:
            yield generation
        finally:
            done = self.release(generation)
            if done is not None:
                done.close()

    def close(self) -> None:
        for channel in self.close_all():
            channel.close()


class AsyncChannels(Channels[grpc.aio.Channel]):
    @asynccontextmanager
    async def use(self) -> AsyncIterator[Generation[grpc.aio.Channel]]:
        """The generation for one call (or one stream), held until the block ends."""
        generation, stale = self.acquire()
        for channel in stale:
            await channel.close(grace=None)
        try:
            yield generation
        finally:
            done = self.release(generation)
            if done is not None:
                await done.close(grace=None)

    async def close(self) -> None:
        for channel in self.close_all():
            await channel.close(grace=None)
