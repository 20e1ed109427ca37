"""The conventions' gRPC call durations over real TLS on loopback: a gpufleet server (both
kinds the skeleton builds) and a gpufleet client each record every call by fully qualified
method and status code — an answered call, one the authorization table refuses, one to a
method the server does not serve — with error.type only where the gRPC conventions count
a failure, and never the peer's address."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from gpufleet.common import errors, grpcclient
from gpufleet.common.grpcserver import ServiceBinding, create_aio_server, create_server
from gpufleet.common.metrics.catalog import RPC_CLIENT_CALL_DURATION, RPC_SERVER_CALL_DURATION
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc
from tests.support import tls
from tests.support.metrics import MetricsProbe, Series

SERVER = RPC_SERVER_CALL_DURATION.name
CLIENT = RPC_CLIENT_CALL_DURATION.name
CHECK = "grpc.health.v1.Health/Check"
RUN_SWEEP = "gpufleet.v1.SweeperService/RunSweep"
NOWHERE = "gpufleet.v1.NoSuchService/Nothing"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
# The semantic conventions' buckets for RPC durations, in seconds.
RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class _Sweeper(sweeper_service_pb2_grpc.SweeperServiceServicer):  # type: ignore[misc]
    """A sweeper whose database is gone: RunSweep answers UNAVAILABLE; the rest of the
    service is the generated base's."""

    def RunSweep(self, request: Any, context: Any) -> Any:
        raise errors.Unavailable("the database is down")


def series(method: str, code: str, *, failed: bool) -> Series:
    labels = {"rpc.system.name": "grpc", "rpc.method": method, "rpc.response.status_code": code}
    if failed:
        labels["error.type"] = code
    return tuple(sorted(labels.items()))


def recorded(probe: MetricsProbe, name: str, expected: dict[Series, int]) -> dict[Series, float]:
    """What ``probe`` recorded as ``name``, once it has recorded as many calls as ``expected``
    holds (10 s at most). A call's answer may reach the caller a moment before its record
    lands: an asyncio server sends an aborted call's status before the handler's coroutine
    has unwound, and a stream's callbacks run after its reader has seen the end."""
    deadline = time.monotonic() + 10
    while sum(probe.series(name).values()) < sum(expected.values()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return probe.series(name)


@pytest.fixture(params=["threaded", "asyncio"])
def serve(request: pytest.FixtureRequest) -> Iterator[Callable[[MetricsProbe], int]]:
    """Starts a sweeper-shaped server (SweeperService, health and reflection) recording
    through a probe; returns its port."""
    stops: list[Callable[[], None]] = []

    def start(probe: MetricsProbe) -> int:
        binding = ServiceBinding(
            sweeper_service_pb2_grpc.add_SweeperServiceServicer_to_server,
            _Sweeper(),
            sweeper_service_pb2.DESCRIPTOR.services_by_name["SweeperService"].full_name,
        )
        build: Any = create_server if request.param == "threaded" else create_aio_server
        server = build(
            "127.0.0.1:0",
            [binding],
            transport=tls.transport("sweeper"),
            max_workers=4,
            instruments=probe.instruments,
        )
        stops.append(lambda: server.stop(0))
        return int(server.port)

    yield start
    for stop in stops:
        stop()


@pytest.fixture
def probes() -> Iterator[tuple[MetricsProbe, MetricsProbe]]:
    server, client = MetricsProbe(), MetricsProbe()
    yield server, client
    server.close()
    client.close()


def test_server_and_client_record_each_call_by_method_and_status(
    serve: Callable[[MetricsProbe], int], probes: tuple[MetricsProbe, MetricsProbe]
) -> None:
    server_probe, client_probe = probes
    address = f"127.0.0.1:{serve(server_probe)}"

    def channel(who: str | Role) -> grpc.Channel:
        return grpcclient.open_channel(
            address, tls.transport(who), Role.SWEEPER, instruments=client_probe.instruments
        )

    with channel(Role.OPERATOR) as operator, channel("machine:m-durations") as machine:
        served = health_pb2_grpc.HealthStub(operator).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert served.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            sweeper_service_pb2_grpc.SweeperServiceStub(machine).RunSweep(
                sweeper_service_pb2.RunSweepRequest(request_id="r1"), timeout=10
            )
        assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
        with pytest.raises(grpc.RpcError) as unknown:
            operator.unary_unary(f"/{NOWHERE}")(b"", timeout=10)
        assert unknown.value.code() is grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]

    # The server: a refusal is the caller's failure, not the server's (no error.type); a
    # method it does not serve is _OTHER, whatever name the caller sent.
    served_calls = {
        series(CHECK, "OK", failed=False): 1,
        series(RUN_SWEEP, "PERMISSION_DENIED", failed=False): 1,
        series("_OTHER", "UNIMPLEMENTED", failed=True): 1,
    }
    assert recorded(server_probe, SERVER, served_calls) == served_calls
    # The client: every status but OK is a failed call.
    assert client_probe.series(CLIENT) == {
        series(CHECK, "OK", failed=False): 1,
        series(RUN_SWEEP, "PERMISSION_DENIED", failed=True): 1,
        series(NOWHERE, "UNIMPLEMENTED", failed=True): 1,
    }
    for probe, name in ((server_probe, SERVER), (client_probe, CLIENT)):
        for point in probe.points(name).values():
            assert point.sum > 0
            assert tuple(point.explicit_bounds) == RPC_BUCKETS


def test_a_call_the_handler_fails_is_the_servers_failure(
    serve: Callable[[MetricsProbe], int], probes: tuple[MetricsProbe, MetricsProbe]
) -> None:
    """An allowed caller reaches the handler, which answers UNAVAILABLE: the server counts
    the call as its own failure, by the method's name."""
    server_probe, client_probe = probes
    address = f"127.0.0.1:{serve(server_probe)}"
    with grpcclient.open_channel(
        address, tls.transport(Role.OPERATOR), Role.SWEEPER, instruments=client_probe.instruments
    ) as operator:
        with pytest.raises(grpc.RpcError) as failed:
            sweeper_service_pb2_grpc.SweeperServiceStub(operator).RunSweep(
                sweeper_service_pb2.RunSweepRequest(request_id="r1"), timeout=10
            )
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    failure = {series(RUN_SWEEP, "UNAVAILABLE", failed=True): 1}
    assert recorded(server_probe, SERVER, failure) == failure
    assert client_probe.series(CLIENT) == {series(RUN_SWEEP, "UNAVAILABLE", failed=True): 1}


def test_a_stream_is_timed_from_its_start_to_its_end(
    serve: Callable[[MetricsProbe], int], probes: tuple[MetricsProbe, MetricsProbe]
) -> None:
    """Reflection streams an answer to each request until the caller's requests end."""
    server_probe, client_probe = probes
    address = f"127.0.0.1:{serve(server_probe)}"
    asks = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(),
    ]
    with grpcclient.open_channel(
        address, tls.transport(Role.OPERATOR), Role.SWEEPER, instruments=client_probe.instruments
    ) as operator:
        answers = list(reflection_pb2_grpc.ServerReflectionStub(operator).ServerReflectionInfo(iter(asks)))
    assert len(answers) == 2
    streamed = {series(REFLECTION, "OK", failed=False): 1}
    assert recorded(server_probe, SERVER, streamed) == streamed
    assert recorded(client_probe, CLIENT, streamed) == streamed


@pytest.mark.parametrize("build", [create_server, create_aio_server], ids=["threaded", "asyncio"])
def test_a_stream_its_deadline_ends_is_deadline_exceeded_on_both_sides(
    build: Any, probes: tuple[MetricsProbe, MetricsProbe]
) -> None:
    """Health's Watch never ends by itself: the caller's deadline ends it. The threaded
    health service's stream then just stops, and the asyncio one's coroutine (writing to
    its context) is cancelled: either way the server reads from its own clock how the call
    ended, instead of counting it OK or CANCELLED."""
    server_probe, client_probe = probes
    server = build(
        "127.0.0.1:0", [], transport=tls.transport("sweeper"), instruments=server_probe.instruments
    )
    try:
        with grpcclient.open_channel(
            f"127.0.0.1:{server.port}",
            tls.transport(Role.OPERATOR),
            Role.SWEEPER,
            instruments=client_probe.instruments,
        ) as operator:
            watch = health_pb2_grpc.HealthStub(operator).Watch(health_pb2.HealthCheckRequest(), timeout=0.3)
            with pytest.raises(grpc.RpcError) as ended:
                for answer in watch:
                    assert answer.status == health_pb2.HealthCheckResponse.SERVING
        assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
        expired = {series("grpc.health.v1.Health/Watch", "DEADLINE_EXCEEDED", failed=True): 1}
        assert recorded(server_probe, SERVER, expired) == expired
        assert recorded(client_probe, CLIENT, expired) == expired
    finally:
        server.stop(0)
