"""The client follows its certificate folder: a long-running backend keeps its client while
the certificate is renewed under it, by ``gpufleet certs issue`` into the same folder or by
a kubelet swapping a Secret's files.

Against the real scheduler (real mutual TLS, real PostgreSQL) the first certificate is one
of the tests' CA that runs out seconds later. It is renewed mid-run (a new key pair, the
same identity) while unary calls go on and a watch holds its stream open; then it expires,
and a certificate that has expired is refused on a new connection. The scheduler is then
restarted, so every connection is new: the calls succeed and the watch resumes, which they
can only do with the new certificate.

Against a stand-in JobService (real gRPC, real TLS) that records the serial of the
certificate each call came with, and holds one call until released: a call in flight when
the files change finishes on its channel, the next call comes with the new serial, and the
old channel is closed once its last call ended.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from gpufleet.client import AsyncClient, Client, GpufleetApiError
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.integration.client.conftest import Scheduler, issue_certs, watch_in_thread
from tests.support import tls
from tests.support.kubelet_volume import KubeletVolume

# The first certificate's life: long enough to open the client, make its first calls and
# renew, short enough to wait out.
SHORT_LIFE_S = 12.0
SCHEDULER_NAME = f"scheduler.gpufleet.{tls.DEFAULT_DEPLOYMENT}"


def folder_files(folder: Path) -> TlsFiles:
    return TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")


def issue_short_lived(out: Path, seconds: float) -> x509.Certificate:
    """A backend certificate of the tests' CA that expires ``seconds`` from now."""
    authority = tls.authority()
    start = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1, seconds=-seconds)
    Authority(authority.folder, authority.deployment, now=lambda: start).issue(
        Identity(Role.BACKEND, authority.deployment), folder_files(out), days=1
    )
    return leaf(out)


def leaf(folder: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate((folder / "tls.crt").read_bytes())


def wait_until(done: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.05)


def until_expired(cert: x509.Certificate) -> None:
    left = (cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)).total_seconds()
    assert left > 0, "the first certificate expired before it was renewed: the test ran too slowly"
    time.sleep(left + 1.0)


def refused_on_a_new_connection(address: str, kept: Path) -> bool:
    """A plain channel holding the files in ``kept`` for good: is its call refused?"""
    ca, cert, key = folder_files(kept).read()
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    options = [("grpc.ssl_target_name_override", SCHEDULER_NAME)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        try:
            job_service_pb2_grpc.JobServiceStub(channel).GetJob(
                job_service_pb2.GetJobRequest(job_id="none"), timeout=5
            )
        except grpc.RpcError as err:
            return err.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined,no-any-return]
    return False


def test_a_client_keeps_working_across_certs_issue_into_its_folder(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    folder = tmp_path / "backend"
    first = issue_short_lived(folder, SHORT_LIFE_S)
    kept = tmp_path / "first"
    shutil.copytree(folder, kept)
    with Client(scheduler.address, folder, certs_check_interval=0.2) as fleet:
        fleet.create_workspace("studio-1", "studio")
        job = fleet.submit_job("studio-1", "clip")
        watcher = watch_in_thread(fleet, job.job_id)
        seen, failed = watcher.seen, watcher.failed
        wait_until(lambda: bool(seen), "first event")

        # Calls go on all along: before, during and after the renewal, and after the first
        # certificate has expired.
        calls, call_errors = [0], list[GpufleetApiError]()
        stop = threading.Event()

        def keep_calling() -> None:
            while not stop.is_set():
                try:
                    fleet.get_job(job.job_id)
                    calls[0] += 1
                except GpufleetApiError as err:
                    call_errors.append(err)
                time.sleep(0.05)

        caller = threading.Thread(target=keep_calling, daemon=True)
        caller.start()
        wait_until(lambda: calls[0] >= 3, "call before the renewal")

        # The real CLI, into the same folder: a new key pair, the same identity (it writes the
        # key, then the certificate: the client must not take the new key with the old one).
        issue_certs("backend", folder)
        second = leaf(folder)
        assert second.serial_number != first.serial_number
        assert second.public_key() != first.public_key()
        wait_until(lambda: fleet.channels.opened == 2, "new channel after the renewal")
        # The watch's stream is still on the first channel, which stays open for it.
        assert fleet.channels.open_channels == 2 and watcher.is_alive()
        at_renewal = calls[0]

        until_expired(first)
        assert refused_on_a_new_connection(scheduler.address, kept), "an expired certificate was taken"
        stop.set()
        caller.join(10)
        assert not call_errors, call_errors
        assert calls[0] > at_renewal + 10, calls

        # Every connection made again: only the renewed certificate can make one now.
        scheduler.stop()
        scheduler.start_again()
        assert fleet.get_job(job.job_id).job_id == job.job_id
        fleet.cancel_job(job.job_id)
        assert watcher.join(60) and not failed, failed
        sequences = [e.sequence for e in seen]
        assert sequences == sorted(set(sequences)), "an event was given twice"
        assert seen[-1].state == job_pb2.JOB_STATE_CANCELLED
        # The first channel went with the watch's broken stream; only one was opened since.
        assert (fleet.channels.opened, fleet.channels.open_channels) == (2, 1)
        assert fleet.channels.current.folder is not None
        assert fleet.channels.current.folder.serial == second.serial_number


def test_an_async_client_follows_a_kubelet_swapped_secret(scheduler: Scheduler, tmp_path: Path) -> None:
    volume = KubeletVolume(tmp_path / "mount")
    staged = tmp_path / "staged"
    first = issue_short_lived(staged / "1", SHORT_LIFE_S)
    volume.publish_files(folder_files(staged / "1"))

    async def main() -> tuple[list[job_pb2.JobEvent], AsyncClient]:
        async with AsyncClient(scheduler.address, volume.folder, certs_check_interval=0.2) as fleet:
            await fleet.create_workspace("studio-2", "studio")
            job = await fleet.submit_job("studio-2", "clip")
            seen: list[job_pb2.JobEvent] = []
            first_event = asyncio.Event()

            async def follow() -> None:
                async for event in fleet.watch_job(job.job_id):
                    seen.append(event)
                    first_event.set()

            watcher = asyncio.create_task(follow())
            await asyncio.wait_for(first_event.wait(), 30)

            # A renewed Secret: the kubelet swaps every file at once.
            tls.authority().issue(Identity(Role.BACKEND, tls.DEFAULT_DEPLOYMENT), folder_files(staged / "2"))
            volume.publish_files(folder_files(staged / "2"))
            deadline = time.monotonic() + 30
            while fleet.channels.opened < 2:
                assert time.monotonic() < deadline, "no new channel after the swap"
                await fleet.get_job(job.job_id)
                await asyncio.sleep(0.1)
            assert fleet.channels.open_channels == 2 and not watcher.done()

            await asyncio.to_thread(until_expired, first)
            assert await asyncio.to_thread(refused_on_a_new_connection, scheduler.address, staged / "1")
            assert (await fleet.get_job(job.job_id)).job_id == job.job_id

            # A crash: every connection cut at once, then made again with the new certificate.
            await asyncio.to_thread(scheduler.process.kill)
            await asyncio.to_thread(scheduler.start_again)
            await fleet.cancel_job(job.job_id)
            await asyncio.wait_for(watcher, 60)
            assert (fleet.channels.opened, fleet.channels.open_channels) == (2, 1)
            assert fleet.channels.current.folder is not None
            assert fleet.channels.current.folder.serial == leaf(staged / "2").serial_number
            return seen, fleet

    seen, _ = asyncio.run(main())
    sequences = [e.sequence for e in seen]
    assert sequences == sorted(set(sequences)), "an event was given twice"
    assert seen[-1].state == job_pb2.JOB_STATE_CANCELLED


# ---- which certificate each call came with -----------------------------------------------------


class SerialsSeen(job_service_pb2_grpc.JobServiceServicer):
    """GetJob answers at once, except for job ``held``, which waits until released; every
    call's client certificate serial is recorded as it arrives."""

    def __init__(self) -> None:
        self.serials: list[tuple[str, int]] = []
        self.held = threading.Event()
        self.release = threading.Event()

    def GetJob(self, request: Any, context: grpc.ServicerContext) -> job_pb2.Job:
        pem: Any = context.auth_context()["x509_pem_cert"][0]  # bytes (grpc-stubs say otherwise)
        self.serials.append((request.job_id, x509.load_pem_x509_certificate(pem).serial_number))
        if request.job_id == "held":
            self.held.set()
            self.release.wait(30)
        return job_pb2.Job(job_id=request.job_id)


@pytest.fixture
def stand_in() -> Iterator[tuple[SerialsSeen, str]]:
    jobs = SerialsSeen()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    job_service_pb2_grpc.add_JobServiceServicer_to_server(jobs, server)
    port = tls.transport("scheduler").add_port(server, "127.0.0.1:0")
    server.start()
    yield jobs, f"127.0.0.1:{port}"
    jobs.release.set()
    server.stop(0)


def renew(folder: Path) -> int:
    tls.authority().issue(Identity(Role.BACKEND, tls.DEFAULT_DEPLOYMENT), folder_files(folder))
    return leaf(folder).serial_number


def test_a_call_in_flight_finishes_on_its_channel_and_the_next_brings_the_new_serial(
    stand_in: tuple[SerialsSeen, str], tmp_path: Path
) -> None:
    jobs, address = stand_in
    folder = tmp_path / "backend"
    old = renew(folder)
    with Client(address, folder, certs_check_interval=0) as fleet:
        answers: list[str] = []
        held = threading.Thread(target=lambda: answers.append(fleet.get_job("held").job_id), daemon=True)
        held.start()
        assert jobs.held.wait(10)
        new = renew(folder)
        assert fleet.get_job("after").job_id == "after"
        assert (fleet.channels.opened, fleet.channels.open_channels) == (2, 2)
        jobs.release.set()
        held.join(10)
        assert answers == ["held"]  # not cancelled by the change
        assert fleet.channels.open_channels == 1  # the old channel closed after its last call
        assert fleet.get_job("later").job_id == "later"
    assert jobs.serials == [("held", old), ("after", new), ("later", new)]


def test_the_async_client_the_same(stand_in: tuple[SerialsSeen, str], tmp_path: Path) -> None:
    jobs, address = stand_in
    folder = tmp_path / "backend"
    old = renew(folder)

    async def main() -> None:
        async with AsyncClient(address, folder, certs_check_interval=0) as fleet:
            held = asyncio.create_task(fleet.get_job("held"))
            assert await asyncio.to_thread(jobs.held.wait, 10)
            new = renew(folder)
            assert (await fleet.get_job("after")).job_id == "after"
            assert (fleet.channels.opened, fleet.channels.open_channels) == (2, 2)
            jobs.release.set()
            assert (await asyncio.wait_for(held, 10)).job_id == "held"
            assert fleet.channels.open_channels == 1
            assert jobs.serials == [("held", old), ("after", new)]

    asyncio.run(main())
