"""Every door of every service, tried with every kind of caller, over real TLS to real
processes — generated from the services' descriptors and the authorization table, so a
new method without a rule fails here as well as in the unit test.

For each method: plaintext, no certificate and a certificate of another CA are refused at
the handshake (the caller never reaches a handler); each role the table does not allow
gets PERMISSION_DENIED; an allowed role is served (the call reaches its handler and gets
whatever its empty request deserves, never a refusal)."""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor

import gpufleet.v1
from gpufleet.common.trust import authz
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles, issue_with
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import (
    agent_service_pb2,
    catalog_service_pb2,
    fleet_service_pb2,
    job_service_pb2,
    provisioner_service_pb2,
    reaper_service_pb2,
    sweeper_service_pb2,
    token_service_pb2,
    worker_service_pb2,
    workspace_service_pb2,
)
from tests.support import rich_errors, tls
from tests.support.procs import ServiceProcess, start_service

SERVED_BY: dict[str, tuple[str, object]] = {
    "JobService": ("scheduler", job_service_pb2),
    "FleetService": ("scheduler", fleet_service_pb2),
    "WorkspaceService": ("scheduler", workspace_service_pb2),
    "CatalogService": ("scheduler", catalog_service_pb2),
    "WorkerService": ("scheduler", worker_service_pb2),
    "ReaperService": ("reaper", reaper_service_pb2),
    "SweeperService": ("sweeper", sweeper_service_pb2),
    "ProvisionerService": ("provisioner", provisioner_service_pb2),
    "AgentService": ("agent", agent_service_pb2),
    "TokenService": ("scheduler", token_service_pb2),
}
# Contracts with a rule but no server yet: said here, so none is forgotten silently.
NOT_SERVED_YET: dict[str, object] = {}
MACHINE_ID = "m-authz"
REFUSED_AT_HANDSHAKE = grpc.StatusCode.UNAVAILABLE


@dataclass(frozen=True)
class Door:
    service: str
    method: MethodDescriptor

    @property
    def path(self) -> str:
        return f"/gpufleet.v1.{self.service}/{self.method.name}"

    def __str__(self) -> str:
        return f"{self.service}.{self.method.name}"


def doors() -> list[Door]:
    found = []
    for name, (_, module) in SERVED_BY.items():
        service: ServiceDescriptor = module.DESCRIPTOR.services_by_name[name]  # type: ignore[attr-defined]
        found.extend(Door(name, m) for m in service.methods)
    return found


def test_every_contract_is_served_or_said_not_to_be() -> None:
    """Every service of every gpufleet.v1 module, a new module's included."""
    contracts = {
        s
        for info in pkgutil.iter_modules(gpufleet.v1.__path__)
        if info.name.endswith("_pb2")
        for s in importlib.import_module(f"gpufleet.v1.{info.name}").DESCRIPTOR.services_by_name
    }
    assert contracts == set(SERVED_BY) | set(NOT_SERVED_YET)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory, postgres: object) -> Iterator[dict[str, str]]:
    from tests.conftest import fresh_postgres_url

    root = tmp_path_factory.mktemp("authz")
    url = fresh_postgres_url(postgres)  # type: ignore[arg-type]
    procs: list[ServiceProcess] = []
    agent: subprocess.Popen[bytes] | None = None
    try:
        prov = start_service("provisioner", root, {"GPUFLEET_DRIVERS": "sim"})
        procs.append(prov)
        common = {"GPUFLEET_DATABASE_URL": url, "GPUFLEET_PROVISIONER_ADDRESS": prov.address}
        procs += [start_service(n, root, common) for n in ("scheduler", "reaper", "sweeper")]
        state = root / "agent"
        state.mkdir()
        env = {
            **os.environ,
            **tls.env(f"machine:{MACHINE_ID}"),
            "GPUFLEET_MACHINE_ID": MACHINE_ID,
            "GPUFLEET_AGENT_STATE_DIR": str(state),
            "GPUFLEET_SCHEDULER_ADDRESS": procs[1].address,
            "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
            "GPUFLEET_WALLS": "off",
        }
        log = (root / "agent.log").open("ab")
        agent = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.agent"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a machine: its worker goes with it at the end
        )
        deadline = time.monotonic() + 30
        while not (state / "agent.port").exists():
            assert agent.poll() is None and time.monotonic() < deadline, (root / "agent.log").read_text()
            time.sleep(0.05)
        addresses = {p.name: p.address for p in procs}
        addresses["agent"] = f"127.0.0.1:{(state / 'agent.port').read_text().strip()}"
        yield addresses
    finally:
        if agent is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)
        for p in procs:
            p.stop()


def server_role(service: str) -> Role:
    part = SERVED_BY[service][0]
    return Role.MACHINE if part == "agent" else Role(part)


def who(role: Role) -> str:
    return f"machine:{MACHINE_ID}" if role is Role.MACHINE else role.value


def call(door: Door, channel: grpc.Channel) -> grpc.StatusCode:
    """The status an empty request gets through that door."""
    request_cls = message_factory.GetMessageClass(door.method.input_type)
    response_cls = message_factory.GetMessageClass(door.method.output_type)
    if door.method.server_streaming:
        stream = channel.unary_stream(
            door.path,
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        try:
            for _ in stream(request_cls(), timeout=5):
                break
        except grpc.RpcError as err:
            return err.code()  # type: ignore[attr-defined,no-any-return]
        return grpc.StatusCode.OK
    unary = channel.unary_unary(
        door.path,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )
    try:
        unary(request_cls(), timeout=10)
    except grpc.RpcError as err:
        return err.code()  # type: ignore[attr-defined,no-any-return]
    return grpc.StatusCode.OK


def channel_as(address: str, service: str, files: TlsFiles | None, trust: bytes) -> grpc.Channel:
    key, chain = (files.key.read_bytes(), files.cert.read_bytes()) if files else (None, None)
    creds = grpc.ssl_channel_credentials(root_certificates=trust, private_key=key, certificate_chain=chain)
    role = server_role(service)
    name = Transport("local", None).server_name(role, MACHINE_ID if role is Role.MACHINE else None)
    return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", name)])


@pytest.fixture(scope="module")
def strangers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    """Callers the deployment must not let in: another CA's operator, and certificates of
    our own CA that name no identity it accepts."""
    root = tmp_path_factory.mktemp("strangers")
    other = Authority.ensure(root / "other-ca", "local")
    ours = tls.authority()
    made = {"other_ca": other.ensure_part(Identity(Role.OPERATOR, "local"))}
    # A machine identity signed by the root, a scheduler signed by the machine CA, and an
    # operator of another deployment signed by our root: each reads as no identity here.
    cases = {
        "machine_by_root": (ours.root(), Identity(Role.MACHINE, "local", "m-x")),
        "scheduler_by_machine_ca": (ours.machine_signer(), Identity(Role.SCHEDULER, "local")),
        "other_deployment": (ours.root(), Identity(Role.OPERATOR, "elsewhere")),
    }
    for name, (signer, identity) in cases.items():
        files = TlsFiles(ours.ca_path, root / f"{name}.crt", root / f"{name}.key")
        issue_with(signer, ours.ca_path.read_bytes(), identity, files)
        made[name] = files
    return made


@pytest.mark.parametrize("door", doors(), ids=str)
def test_each_door_refuses_strangers_and_wrong_roles_and_serves_its_roles(
    door: Door, plane: dict[str, str], strangers: dict[str, TlsFiles]
) -> None:
    address = plane[SERVED_BY[door.service][0]]
    trust = tls.authority().ca_path.read_bytes()
    allowed = authz.RULES[door.path]

    with grpc.insecure_channel(address) as plaintext:
        assert call(door, plaintext) == REFUSED_AT_HANDSHAKE, "plaintext"
    with channel_as(address, door.service, None, trust) as anonymous:
        assert call(door, anonymous) == REFUSED_AT_HANDSHAKE, "no certificate"
    with channel_as(address, door.service, strangers["other_ca"], trust) as foreign:
        assert call(door, foreign) == REFUSED_AT_HANDSHAKE, "a certificate of another CA"
    for name in ("machine_by_root", "scheduler_by_machine_ca", "other_deployment"):
        with channel_as(address, door.service, strangers[name], trust) as odd:
            assert call(door, odd) == grpc.StatusCode.UNAUTHENTICATED, name

    for role in Role:
        with channel_as(address, door.service, tls.files(who(role)), trust) as ch:
            code = call(door, ch)
        if role in allowed:
            assert code not in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED), role
            assert code != REFUSED_AT_HANDSHAKE, role
        else:
            assert code == grpc.StatusCode.PERMISSION_DENIED, role


def test_a_refusal_says_why_in_the_rich_error_model(
    plane: dict[str, str], strangers: dict[str, TlsFiles]
) -> None:
    """A client tells a wrong role from a stranger by ErrorInfo's reason (domain
    gpufleet.dev), as it reads every other error of ours — not by parsing the message."""
    door = next(d for d in doors() if d.path == "/gpufleet.v1.JobService/GetJob")
    address = plane[SERVED_BY[door.service][0]]
    trust = tls.authority().ca_path.read_bytes()
    request_cls = message_factory.GetMessageClass(door.method.input_type)
    response_cls = message_factory.GetMessageClass(door.method.output_type)

    def refused(files: TlsFiles) -> rich_errors.Refusal:
        with channel_as(address, door.service, files, trust) as ch:
            get_job = ch.unary_unary(
                door.path,
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            return rich_errors.refusal(get_job, request_cls(job_id="j-1"))

    wrong_role = refused(tls.files(who(Role.GATEWAY)))
    assert (wrong_role.code, wrong_role.reason, wrong_role.domain) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "WRONG_ROLE",
        "gpufleet.dev",
    )
    assert "may not call" in wrong_role.message
    stranger = refused(strangers["other_deployment"])
    assert (stranger.code, stranger.reason) == (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
