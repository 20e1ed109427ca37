"""Both server skeletons (threaded and asyncio) and the following client channel, in one
process over loopback TLS: a certificate swapped into the server's folder is what the next
connection gets, a stream opened before goes on, and a client whose files changed opens
its next calls on a new channel while a stream on the old one goes on."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpufleet.common.grpcserver import AioServiceServer, ServiceServer, create_aio_server, create_server
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles
from gpufleet.common.trust.reloading_channel import ReloadingChannel
from gpufleet.common.trust.transport import Transport
from tests.support.kubelet_volume import KubeletVolume

DEPLOYMENT = "reloading"
SCHEDULER = Identity(Role.SCHEDULER, DEPLOYMENT)
OPERATOR = Identity(Role.OPERATOR, DEPLOYMENT)
SEEN_WITHIN_S = 10.0


def issue(authority: Authority, who: Identity, folder: Path) -> TlsFiles:
    folder.mkdir(parents=True)
    return authority.issue(who, TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key"))


def leaf(files: TlsFiles) -> x509.Certificate:
    return x509.load_pem_x509_certificate(files.cert.read_bytes())


def presented(port: int, client: TlsFiles) -> int:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=client.ca.read_text())
    context.load_cert_chain(str(client.cert), str(client.key))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=SCHEDULER.server_name) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


Start = Callable[[Transport], ServiceServer | AioServiceServer]
KINDS: dict[str, Start] = {
    "threaded": lambda t: create_server("127.0.0.1:0", [], transport=t),
    "asyncio": lambda t: create_aio_server("127.0.0.1:0", [], transport=t),
}


@pytest.fixture(params=sorted(KINDS))
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Authority, KubeletVolume, int]]:
    authority = Authority.ensure(tmp_path / "ca", DEPLOYMENT)
    volume = KubeletVolume(tmp_path / "server")
    volume.publish_files(issue(authority, SCHEDULER, tmp_path / "s1"))
    transport = Transport.from_paths(
        DEPLOYMENT, str(volume.files.ca), str(volume.files.cert), str(volume.files.key), False, "test"
    )
    server = KINDS[request.param](transport)
    try:
        yield authority, volume, server.port
    finally:
        server.stop(0)


def test_a_swapped_certificate_is_served_to_new_connections_and_old_ones_go_on(
    served: tuple[Authority, KubeletVolume, int], tmp_path: Path
) -> None:
    authority, volume, port = served
    client_volume = KubeletVolume(tmp_path / "client")
    client_volume.publish_files(issue(authority, OPERATOR, tmp_path / "c1"))
    client = Transport(DEPLOYMENT, client_volume.files)
    channel = client.channel(f"127.0.0.1:{port}", SCHEDULER.server_name)
    assert isinstance(channel, ReloadingChannel)
    stub = health_pb2_grpc.HealthStub(channel)
    watch = stub.Watch(health_pb2.HealthCheckRequest())
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    assert presented(port, client_volume.files) == leaf(volume.files).serial_number

    renewed = issue(authority, SCHEDULER, tmp_path / "s2")
    volume.publish_files(renewed)
    client_volume.publish_files(issue(authority, OPERATOR, tmp_path / "c2"))
    deadline = time.monotonic() + SEEN_WITHIN_S
    while presented(port, client_volume.files) != leaf(renewed).serial_number:
        assert time.monotonic() < deadline, "the server still hands out its first certificate"
        time.sleep(0.05)

    deadline = time.monotonic() + SEEN_WITHIN_S
    while channel.channels_opened == 1:  # the client's files are read again about once a second
        assert time.monotonic() < deadline, "the client never took its new certificate"
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
        time.sleep(0.05)
    assert (
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    assert channel.channels_opened == 2
    assert watch.is_active()  # type: ignore[attr-defined]  # the stream on the first channel goes on
    watch.cancel()  # type: ignore[attr-defined]
    channel.close()
    with pytest.raises(ValueError, match="closed channel"):
        stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
