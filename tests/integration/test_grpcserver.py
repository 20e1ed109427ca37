"""The one server skeleton, over real gRPC on loopback with the deployment's mutual TLS, on
each kind of server it builds (threaded; asyncio, a service's synchronous handlers on the
default executor or on a lane of their own): health's Watch streams the status and ends
cleanly when its caller leaves; a method of a generated servicer that the service does not
implement answers UNIMPLEMENTED, never INTERNAL — each without an error in the server's
log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpufleet.common.grpcserver import (
    AioServiceServer,
    Lane,
    ServiceBinding,
    ServiceServer,
    create_aio_server,
    create_server,
)
from gpufleet.common.metrics.catalog import RPC_SERVER_CALL_DURATION
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc
from tests.integration.telemetry.test_rpc_durations import recorded, series
from tests.support import tls
from tests.support.metrics import MetricsProbe

SWEEPER = sweeper_service_pb2.DESCRIPTOR.services_by_name["SweeperService"].full_name
WATCH = "grpc.health.v1.Health/Watch"
LIST_SWEEPS = "gpufleet.v1.SweeperService/ListSweeps"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Sweeper(sweeper_service_pb2_grpc.SweeperServiceServicer):  # type: ignore[misc]
    """Implements RunSweep only: ListSweeps and ListOrphans are the generated base's."""

    def RunSweep(self, request: Any, context: Any) -> Any:
        return sweeper_service_pb2.Sweep()


Server = ServiceServer | AioServiceServer
Serve = Callable[[MetricsProbe], Server]


def start(kind: str, probe: MetricsProbe) -> Server:
    binding = ServiceBinding(
        sweeper_service_pb2_grpc.add_SweeperServiceServicer_to_server, _Sweeper(), SWEEPER
    )
    transport = (
        Transport(tls.DEFAULT_DEPLOYMENT, None) if kind == "asyncio-plaintext" else tls.transport("sweeper")
    )
    if kind == "threaded":
        return create_server(
            "127.0.0.1:0", [binding], transport=transport, max_workers=4, instruments=probe.instruments
        )
    lanes = [Lane(SWEEPER, 2)] if kind == "asyncio-lane" else []
    return create_aio_server(
        "127.0.0.1:0",
        [binding],
        transport=transport,
        max_workers=4,
        lanes=lanes,
        instruments=probe.instruments,
    )


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


@pytest.fixture
def server_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """Every record of the process from WARNING up: the servers' threads log into it too."""
    caplog.set_level(logging.WARNING)
    return caplog


def errors_in(log: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in log.records if r.levelno >= logging.ERROR]


def channel(server: Server, kind: str) -> grpc.Channel:
    """A caller's channel, as an operator (grpc's own: a stream the caller can cancel)."""
    if kind == "asyncio-plaintext":
        return grpc.insecure_channel(f"127.0.0.1:{server.port}")
    transport = tls.transport(Role.OPERATOR)
    return transport.channel(f"127.0.0.1:{server.port}", transport.server_name(Role.SWEEPER))


@pytest.mark.parametrize("kind", ["threaded", "asyncio", "asyncio-plaintext"])
def test_watch_streams_the_status_and_ends_cleanly_when_its_caller_cancels(
    kind: str, probe: MetricsProbe, server_log: pytest.LogCaptureFixture
) -> None:
    """On the asyncio server Watch is a coroutine that writes to its context: the
    skeleton's wrappers (the error mapping, the authorization table's) stream it as they
    stream an async generator. The caller's cancel ends it; the server counts the call
    CANCELLED, the caller's doing, not a failure of its own."""
    server = start(kind, probe)
    try:
        with channel(server, kind) as operator:
            watch = health_pb2_grpc.HealthStub(operator).Watch(
                health_pb2.HealthCheckRequest(service=SWEEPER), timeout=30
            )
            assert next(watch).status == SERVING
            server.set_serving(False)
            assert next(watch).status == NOT_SERVING
            watch.cancel()
            with pytest.raises(grpc.RpcError) as ended:
                next(watch)
            assert ended.value.code() is grpc.StatusCode.CANCELLED  # type: ignore[attr-defined]
            server.set_serving(True)
            # The server watches on: a second caller is streamed the status as the first was.
            again = health_pb2_grpc.HealthStub(operator).Watch(
                health_pb2.HealthCheckRequest(service=SWEEPER), timeout=30
            )
            assert next(again).status == SERVING
            again.cancel()
        cancelled = {series(WATCH, "CANCELLED", failed=False): 2}
        assert recorded(probe, RPC_SERVER_CALL_DURATION.name, cancelled) == cancelled
    finally:
        server.stop(0)
    assert errors_in(server_log) == []


@pytest.mark.parametrize("kind", ["threaded", "asyncio", "asyncio-lane"])
def test_a_method_the_service_does_not_implement_answers_unimplemented(
    kind: str, probe: MetricsProbe, server_log: pytest.LogCaptureFixture
) -> None:
    """The generated base sets UNIMPLEMENTED on its context, then raises
    NotImplementedError: the caller is told so (not INTERNAL), the server logs no stack
    trace for it, and the method the service does implement still answers."""
    server = start(kind, probe)
    try:
        with channel(server, kind) as operator:
            sweeper = sweeper_service_pb2_grpc.SweeperServiceStub(operator)
            with pytest.raises(grpc.RpcError) as unimplemented:
                sweeper.ListSweeps(sweeper_service_pb2.ListSweepsRequest(), timeout=10)
            assert sweeper.RunSweep(sweeper_service_pb2.RunSweepRequest(request_id="r1"), timeout=10)
        assert unimplemented.value.code() is grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
        assert unimplemented.value.details() == "Method not implemented!"  # type: ignore[attr-defined]
        answered = {
            series(LIST_SWEEPS, "UNIMPLEMENTED", failed=True): 1,
            series("gpufleet.v1.SweeperService/RunSweep", "OK", failed=False): 1,
        }
        assert recorded(probe, RPC_SERVER_CALL_DURATION.name, answered) == answered
    finally:
        server.stop(0)
    assert errors_in(server_log) == []
