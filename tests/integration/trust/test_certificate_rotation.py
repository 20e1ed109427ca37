"""Every certificate renewed under running processes, as a kubelet renews a mounted Secret.

Scheduler (on PostgreSQL), reaper, sweeper, provisioner and an agent run as real processes,
each reading its certificate, key and trust bundle from a folder laid out as a kubelet lays
a Secret (``tests.support.kubelet_volume``). Mid-run every part's certificate is issued
again and swapped in; then the CA itself is replaced (a new root, the old one removed from
every bundle) and everything is issued again. After each swap:

- each gRPC port and each metrics listener hands a new connection the new certificate;
- calls go on being served: on connections made before the swap (a health Watch stream
  kept open throughout, unary calls on an old channel) and on new ones;
- the services' own clients open their new connections with their new certificates: the
  provisioner is restarted on the new CA alone and the sweeper, still running, reaches it;
- after the CA rotation a certificate of the old CA, and an expired one of the new CA, are
  refused on a new connection, by gRPC ports and metrics listeners alike.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpufleet.common.trust.identity import Identity
from gpufleet.common.trust.pki import Authority, TlsFiles
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    reaper_service_pb2,
    reaper_service_pb2_grpc,
    sweeper_service_pb2,
    sweeper_service_pb2_grpc,
)
from tests.support import scrape, tls
from tests.support.kubelet_volume import KubeletVolume
from tests.support.postgres import free_port
from tests.support.procs import ServiceProcess, start_service

# A deployment of its own: its CA (the test run's, tests.support.tls) is replaced here.
DEPLOYMENT = "rotation"
MACHINE_ID = "m-rotation"
SERVICES = ("provisioner", "scheduler", "reaper", "sweeper")
# Every part with a volume: the services, the machine, the test's operator and scraper.
PARTS = (*SERVICES, f"machine:{MACHINE_ID}", "operator", "metrics")
SEEN_WITHIN_S = 20.0


def identity(part: str) -> Identity:
    return Identity.parse(part, DEPLOYMENT)


@dataclass
class Plane:
    root: Path
    authority: Authority
    volumes: dict[str, KubeletVolume]
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    metrics: dict[str, int] = field(default_factory=dict)
    agent_port: int = 0

    def address(self, part: str) -> str:
        port = self.agent_port if part.startswith("machine:") else self.procs[part].port
        return f"127.0.0.1:{port}"

    def issue_everything(self, generation: str) -> dict[str, x509.Certificate]:
        """Every part's certificate issued again and swapped into its volume; the machine
        CA's too (the provisioner's). Returns each part's new leaf."""
        leaves = {}
        for part in PARTS:
            staged = self.root / "staged" / generation / part.replace(":", "-")
            staged.mkdir(parents=True)
            files = TlsFiles(staged / "ca.crt", staged / "tls.crt", staged / "tls.key")
            self.authority.issue(identity(part), files)
            self.volumes[part].publish_files(files)
            leaves[part] = x509.load_pem_x509_certificate(files.cert.read_bytes())
        ca = self.authority.folder
        self.volumes["machine-ca"].publish(
            {
                "ca.crt": self.authority.ca_path.read_bytes(),
                "tls.crt": (ca / "machine-ca.crt").read_bytes(),
                "tls.key": (ca / "machine-ca.key").read_bytes(),
            }
        )
        return leaves

    def env(self, part: str) -> dict[str, str]:
        files = self.volumes[part].files
        env = {
            "GPUFLEET_DEPLOYMENT_ID": DEPLOYMENT,
            "GPUFLEET_TLS_CA_FILE": str(files.ca),
            "GPUFLEET_TLS_CERT_FILE": str(files.cert),
            "GPUFLEET_TLS_KEY_FILE": str(files.key),
        }
        if part == "provisioner":
            machine_ca = self.volumes["machine-ca"].files
            env["GPUFLEET_TLS_MACHINE_CA_CERT_FILE"] = str(machine_ca.cert)
            env["GPUFLEET_TLS_MACHINE_CA_KEY_FILE"] = str(machine_ca.key)
        return env

    def start(self, name: str, extra: dict[str, str], port: int = 0, tag: str = "") -> ServiceProcess:
        self.metrics.setdefault(name, free_port())
        env = {
            **self.env(name),
            **extra,
            "GPUFLEET_METRICS_ADDRESS": f"127.0.0.1:{self.metrics[name]}",
        }
        proc = self.procs[name] = start_service(name, self.root, env, port=port, tag=tag)
        return proc


def replace_ca(authority: Authority, scratch: Path) -> None:
    """A new root and machine CA in the authority's folder, the old ones gone (the same
    deployment, so the same names: only the keys tell them apart)."""
    fresh = Authority.ensure(scratch, DEPLOYMENT)
    for name in ("machine-ca.key", "machine-ca.crt", "ca.key", "ca.crt"):
        (authority.folder / name).write_bytes((fresh.folder / name).read_bytes())


def start_agent(plane: Plane) -> subprocess.Popen[bytes]:
    state = plane.root / "agent"
    state.mkdir()
    env = {
        **os.environ,
        **plane.env(f"machine:{MACHINE_ID}"),
        "GPUFLEET_MACHINE_ID": MACHINE_ID,
        "GPUFLEET_AGENT_STATE_DIR": str(state),
        "GPUFLEET_SCHEDULER_ADDRESS": plane.procs["scheduler"].address,
        "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
        "GPUFLEET_WALLS": "off",
    }
    log = (plane.root / "agent.log").open("ab")
    agent = subprocess.Popen(
        [sys.executable, "-m", "gpufleet.agent"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not (state / "agent.port").exists():
        assert agent.poll() is None and time.monotonic() < deadline, (plane.root / "agent.log").read_text()
        time.sleep(0.05)
    plane.agent_port = int((state / "agent.port").read_text().strip())
    return agent


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, postgres: object) -> Iterator[Plane]:
    from tests.conftest import fresh_postgres_url

    root = tmp_path_factory.mktemp("rotation")
    authority = tls.authority(DEPLOYMENT)
    volumes = {
        part: KubeletVolume(root / "mounts" / part.replace(":", "-")) for part in (*PARTS, "machine-ca")
    }
    plane = Plane(root, authority, volumes)
    plane.issue_everything("first")
    url = fresh_postgres_url(postgres)  # type: ignore[arg-type]
    agent: subprocess.Popen[bytes] | None = None
    try:
        prov = plane.start("provisioner", {"GPUFLEET_DRIVERS": "sim"})
        common = {"GPUFLEET_DATABASE_URL": url, "GPUFLEET_PROVISIONER_ADDRESS": prov.address}
        for name in ("scheduler", "reaper", "sweeper"):
            plane.start(name, common)
        agent = start_agent(plane)
        yield plane
    finally:
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)
        for proc in plane.procs.values():
            proc.stop()


# ---- what a caller sees ----------------------------------------------------------------------


def fixed_channel(address: str, part: str, ca: bytes, files: TlsFiles) -> grpc.Channel:
    """A plain gRPC channel holding these credentials for good (no following)."""
    ca_now, cert, key = ca, files.cert.read_bytes(), files.key.read_bytes()
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca_now, private_key=key, certificate_chain=cert
    )
    name = identity(part).server_name
    return grpc.secure_channel(address, credentials, options=[("grpc.ssl_target_name_override", name)])


def snapshot(files: TlsFiles, into: Path) -> TlsFiles:
    """The files' content now, kept (a volume's content changes under its paths)."""
    into.mkdir(parents=True, exist_ok=True)
    kept = TlsFiles(into / "ca.crt", into / "tls.crt", into / "tls.key")
    for src, dst in zip(files.read(), (kept.ca, kept.cert, kept.key), strict=True):
        dst.write_bytes(src)
    return kept


def healthy(channel: grpc.Channel) -> grpc.StatusCode:
    try:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


def presented(port: int, server_name: str, client: TlsFiles, alpn: bool) -> x509.Certificate:
    """The certificate a server hands a new connection (checked against the client's bundle)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=client.ca.read_text())
    context.load_cert_chain(str(client.cert), str(client.key))
    if alpn:
        context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_name) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def until_presented(port: int, part: str, expected: x509.Certificate, client: TlsFiles, alpn: bool) -> None:
    """Until a new connection to ``port`` is handed ``expected`` (the part reads its files
    again about once a second)."""
    deadline = time.monotonic() + SEEN_WITHIN_S
    seen: object = None
    while time.monotonic() < deadline:
        try:
            seen = presented(port, identity(part).server_name, client, alpn).serial_number
        except (ssl.SSLError, OSError) as exc:
            seen = exc  # the old certificate, of a CA the client no longer trusts
        if seen == expected.serial_number:
            return
        time.sleep(0.1)
    raise AssertionError(f"{part} on {port} still hands out {seen}, not {expected.serial_number}")


def run_sweep(plane: Plane, channel: grpc.Channel) -> sweeper_service_pb2.Sweep:
    """A sweep the operator asks for: the sweeper lists the provisioner's instances then."""
    stub = sweeper_service_pb2_grpc.SweeperServiceStub(channel)
    return stub.RunSweep(
        sweeper_service_pb2.RunSweepRequest(
            kind=sweeper_service_pb2.SWEEP_KIND_INVENTORY_RECONCILE, request_id=uuid.uuid4().hex
        ),
        timeout=20,
    )


def api_calls(plane: Plane, channel_of: dict[str, grpc.Channel]) -> None:
    """One call the operator may make to each part (health for the parts it may not call)."""
    fleet_service_pb2_grpc.FleetServiceStub(channel_of["scheduler"]).ListMachines(
        fleet_service_pb2.ListMachinesRequest(), timeout=10
    )
    reaper_service_pb2_grpc.ReaperServiceStub(channel_of["reaper"]).ListWatchdogs(
        reaper_service_pb2.ListWatchdogsRequest(), timeout=10
    )
    sweeper_service_pb2_grpc.SweeperServiceStub(channel_of["sweeper"]).ListSweeps(
        sweeper_service_pb2.ListSweepsRequest(), timeout=10
    )
    for part in ("provisioner", f"machine:{MACHINE_ID}"):
        assert healthy(channel_of[part]) is grpc.StatusCode.OK, part


SERVERS = (*SERVICES, f"machine:{MACHINE_ID}")


def test_certificates_renewed_and_the_ca_rotated_under_running_processes(plane: Plane) -> None:
    operator = plane.volumes["operator"]
    metrics = plane.volumes["metrics"]
    kept = plane.root / "kept"
    first_operator = snapshot(operator.files, kept / "operator-1")
    first_metrics = snapshot(metrics.files, kept / "metrics-1")
    first_ca = first_operator.ca.read_bytes()

    # Before anything changes: connections the test keeps open throughout, each with one
    # call made; a health Watch on each server stays open across both swaps.
    old = {p: fixed_channel(plane.address(p), p, first_ca, first_operator) for p in SERVERS}
    api_calls(plane, old)
    watches = {}
    for part, channel in old.items():
        watches[part] = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert next(watches[part]).status == health_pb2.HealthCheckResponse.SERVING
    # The test's own following client (what the CLI and every service open).
    following = Transport.from_paths(
        DEPLOYMENT, str(operator.files.ca), str(operator.files.cert), str(operator.files.key), False, "test"
    )
    follow = {p: following.channel(plane.address(p), identity(p).server_name) for p in SERVERS}
    api_calls(plane, follow)
    assert "could not list" not in run_sweep(plane, follow["sweeper"]).summary

    # 1. Every certificate issued again under the same CA.
    renewed = plane.issue_everything("second")
    for part in SERVERS:
        until_presented(int(plane.address(part).rsplit(":", 1)[1]), part, renewed[part], operator.files, True)
    for name in SERVICES:
        until_presented(plane.metrics[name], name, renewed[name], metrics.files, False)
    api_calls(plane, old)  # the connections made before
    api_calls(plane, follow)  # the following client: a new channel with its new certificate
    fresh = {p: fixed_channel(plane.address(p), p, first_ca, operator.files) for p in SERVERS}
    api_calls(plane, fresh)  # new connections with the new operator certificate
    # The sweeper's own client to the provisioner: a new connection with its new certificate.
    assert "could not list" not in run_sweep(plane, follow["sweeper"]).summary

    # 2. The CA replaced: a new root, the old one in no bundle; everything issued again.
    replace_ca(plane.authority, plane.root / "second-ca")
    second_ca = plane.authority.ca_path.read_bytes()
    assert second_ca != first_ca
    rotated = plane.issue_everything("third")
    for part in SERVERS:
        until_presented(int(plane.address(part).rsplit(":", 1)[1]), part, rotated[part], operator.files, True)
    for name in SERVICES:
        until_presented(plane.metrics[name], name, rotated[name], metrics.files, False)
    assert operator.files.ca.read_bytes() == second_ca

    api_calls(plane, old)  # a connection made under the old CA goes on
    for part, watch in watches.items():
        assert watch.is_active(), f"{part}: the Watch opened before the swaps was ended"  # type: ignore[attr-defined]
    api_calls(plane, follow)
    api_calls(plane, {p: fixed_channel(plane.address(p), p, second_ca, operator.files) for p in SERVERS})

    # Refused on a new connection: the old CA's operator certificate, and an expired one of
    # the new CA (each presented to a server the client itself trusts, so only the server
    # can be refusing).
    expired_dir = kept / "expired"
    expired_dir.mkdir()
    expired = TlsFiles(expired_dir / "ca.crt", expired_dir / "tls.crt", expired_dir / "tls.key")
    long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=60)
    Authority(plane.authority.folder, DEPLOYMENT, now=lambda: long_ago).issue(identity("operator"), expired)
    for part in SERVERS:
        for refused in (first_operator, expired):
            with fixed_channel(plane.address(part), part, second_ca, refused) as channel:
                assert healthy(channel) is grpc.StatusCode.UNAVAILABLE, (part, refused.cert)
    expired_metrics = kept / "expired-metrics"
    expired_metrics.mkdir()
    expired_scraper = TlsFiles(
        expired_metrics / "ca.crt", expired_metrics / "tls.crt", expired_metrics / "tls.key"
    )
    Authority(plane.authority.folder, DEPLOYMENT, now=lambda: long_ago).issue(
        identity("metrics"), expired_scraper
    )
    for name in SERVICES:
        answer = scrape.get(
            plane.metrics[name],
            context=scrape.client_context(str(metrics.files.ca), metrics.files),
            server_name=identity(name).server_name,
        )
        assert answer.status == 200 and "target_info" in answer.body
        for refused in (first_metrics, expired_scraper):
            context = scrape.client_context(str(metrics.files.ca), refused)
            with pytest.raises((ssl.SSLError, OSError)):
                scrape.get(plane.metrics[name], context=context, server_name=identity(name).server_name)

    # The provisioner restarted on the new CA alone: the sweeper, which has run throughout,
    # reaches it only if its client opens new connections with its new certificate.
    prov = plane.procs["provisioner"]
    prov.stop()
    plane.start("provisioner", {"GPUFLEET_DRIVERS": "sim"}, port=prov.port, tag="-restarted")
    sweep = run_sweep(plane, follow["sweeper"])
    assert "could not list" not in sweep.summary, sweep.summary + plane.procs["sweeper"].log()[-3000:]

    for watch in watches.values():
        watch.cancel()  # type: ignore[attr-defined]
    for channel in (*old.values(), *follow.values()):
        channel.close()
