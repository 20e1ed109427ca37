"""The one gRPC server skeleton every gpufleet service runs on.

It adds what each service would otherwise re-implement: the standard health service,
server reflection, OpenTelemetry instrumentation, the single mapping from
:class:`~gpufleet.common.errors.GpufleetError` to a status code, and a graceful stop.
Tests bind to port 0 and read the chosen port back.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import server_interceptor

from gpufleet.common.errors import FIELD_METADATA_KEY, GpufleetError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceBinding:
    """One servicer and how to attach it: ``add(servicer, server)`` plus its full name."""

    add: Callable[[Any, grpc.Server], None]
    servicer: object
    full_name: str


def _abort(context: grpc.ServicerContext, err: GpufleetError) -> None:
    if err.field:
        # Metadata values must be printable ASCII; a field name can carry a client's own
        # text (a map key), so anything else is escaped rather than failing the answer.
        field = err.field.encode("ascii", "backslashreplace").decode("ascii")
        field = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in field)
        context.set_trailing_metadata(((FIELD_METADATA_KEY, field),))
    context.abort(err.code, err.message)


def _guard_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request, context)
        except GpufleetError as err:
            _abort(context, err)
        except Exception:
            if context.code() is not None:  # type: ignore[attr-defined]  # already aborted on purpose
                raise
            log.exception("unexpected error in %s", getattr(behavior, "__qualname__", behavior))
            context.abort(grpc.StatusCode.INTERNAL, "internal error; see server logs")
        return None

    return wrapper


def _guard_stream(behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behavior(request, context)
        except GpufleetError as err:
            _abort(context, err)
        except Exception:
            if context.code() is not None:  # type: ignore[attr-defined]
                raise
            log.exception("unexpected error in stream %s", getattr(behavior, "__qualname__", behavior))
            context.abort(grpc.StatusCode.INTERNAL, "internal error; see server logs")

    return wrapper


class ErrorMappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg,misc]
    """Turns a GpufleetError raised by any handler into its status, in one place."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _guard_stream(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


class ServiceServer:
    """A started gRPC server with health and reflection; ``port`` is the bound port."""

    def __init__(
        self, server: grpc.Server, port: int, health_servicer: health.HealthServicer, names: Sequence[str]
    ) -> None:
        self.server = server
        self.port = port
        self.health = health_servicer
        self.names = list(names)

    def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in [*self.names, ""]:
            self.health.set(name, status)

    def stop(self, grace: float = 5.0) -> None:
        """Refuse new calls, let running ones finish for ``grace`` seconds, then stop."""
        self.set_serving(False)
        self.server.stop(grace).wait()

    def wait_for_termination(self) -> None:
        self.server.wait_for_termination()


def create_server(
    address: str, bindings: Sequence[ServiceBinding], *, max_workers: int = 32
) -> ServiceServer:
    """Build, bind and start a server; returns it with the port actually bound."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[server_interceptor(), ErrorMappingInterceptor()],
        options=[("grpc.so_reuseport", 0)],
    )
    for binding in bindings:
        binding.add(binding.servicer, server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [b.full_name for b in bindings]
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"could not bind gRPC server to {address}")
    server.start()
    result = ServiceServer(server, port, health_servicer, names)
    result.set_serving(True)
    return result


def run_until_signalled(server: ServiceServer, stop: threading.Event, grace: float = 5.0) -> None:
    """Block until SIGTERM/SIGINT, then stop loops (``stop``) and the server gracefully."""

    def _handler(signum: int, _frame: object) -> None:
        log.info("received signal %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)
    stop.wait()
    server.stop(grace)


def announce_port(port: int, port_file: str | None) -> None:
    """Write the bound port atomically to ``port_file`` (if set) once the server serves."""
    if not port_file:
        return
    import os

    tmp = f"{port_file}.tmp.{os.getpid()}"
    with open(tmp, "w") as fh:
        fh.write(str(port))
    os.replace(tmp, port_file)
