"""The one gRPC server skeleton every gpufleet service runs on.

It adds what each service would otherwise re-implement: the standard health service,
server reflection, OpenTelemetry instrumentation (a span and the conventions' call duration
for every call), the single mapping from :class:`~gpufleet.common.errors.GpufleetError` to a
status code, and a graceful stop.
Tests bind to port 0 and read the chosen port back.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.instrumentation.grpc import server_interceptor

from gpufleet.common.aio_handlers import on_lane, responses
from gpufleet.common.errors import GpufleetError, translated
from gpufleet.common.handler_cache import WrappedHandlers
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.rich_status import status_of
from gpufleet.common.rpc_durations import AioServerCallDurations, ServerCallDurations
from gpufleet.common.signals import stop_on_signals
from gpufleet.common.trust.interceptor import AioAuthorizationInterceptor, AuthorizationInterceptor, Gate
from gpufleet.common.trust.transport import Transport

log = logging.getLogger(__name__)


# A health-check name that says only "this process is alive and serving": SERVING from the
# start to the stop, whatever its dependencies do. An orchestrator's liveness probe asks this
# one; readiness asks "" (or a service's name), which goes NOT_SERVING while the service
# cannot work (its database away): restarting a process for its database's outage would
# only add a crash loop to it.
LIVENESS_SERVICE = "gpufleet.liveness"


@dataclass(frozen=True)
class ServiceBinding:
    """One servicer and how to attach it: ``add(servicer, server)`` plus its full name."""

    add: Callable[[Any, grpc.Server], None]
    servicer: object
    full_name: str


def _abort(context: grpc.ServicerContext, err: GpufleetError) -> None:
    """End the call with the error's rich status (gpufleet.common.rich_status), after any
    trailer the handler set itself (a provider error's kind)."""
    status = status_of(err)
    context.set_trailing_metadata((*_set_already(context), *status.trailing_metadata))
    context.abort(status.code, status.details)


def _set_already(context: Any) -> tuple[tuple[str, str | bytes], ...]:
    return tuple(context.trailing_metadata() or ())


def _guard_unary(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return behavior(request, context)
        except Exception as error:
            _answer(context, method, error)
        return None

    return wrapper


def _guard_stream(method: str, behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    def wrapper(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behavior(request, context)
        except Exception as error:
            _answer(context, method, error)

    return wrapper


def _answer(context: grpc.ServicerContext, method: str, error: Exception) -> None:
    """The status a handler's exception ends its call with (each branch aborts, which
    raises): a GpufleetError's own; a known failure's (UNAVAILABLE for the database's
    loss, gpufleet.common.db.outage); the one the handler chose before it raised (an abort of
    its own, or a generated servicer's method the service does not implement: it sets
    UNIMPLEMENTED, then raises NotImplementedError); else INTERNAL, the one case logged
    with its stack."""
    chosen = context.code()  # type: ignore[attr-defined]
    if isinstance(error, GpufleetError):
        _abort(context, error)
    elif (known := _known(method, error)) is not None:
        _abort(context, known)
    elif isinstance(chosen, grpc.StatusCode) and chosen is not grpc.StatusCode.OK:
        given = context.details()  # type: ignore[attr-defined]  # bytes, as the threaded server keeps it
        details = given.decode("utf-8", "replace") if isinstance(given, bytes) else given
        log.info("%s answered %s: %s", method, chosen.name, details or chosen.value[1])
        context.abort(chosen, details or chosen.value[1])
    else:
        log.error("unexpected error in %s", method, exc_info=error)
        context.abort(grpc.StatusCode.INTERNAL, "internal error; see server logs")


def _known(method: str, error: Exception) -> GpufleetError | None:
    """A known failure of a library's (gpufleet.common.errors.translate_with: the
    database's loss is UNAVAILABLE naming it, retry advised), logged in one line: a known
    condition, no stack."""
    known = translated(error)
    if known is not None:
        log.warning("%s answered %s: %s", method, known.code.name, known.message)
    return known


class ErrorMappingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg,misc]
    """Turns a GpufleetError raised by any handler into its status, in one place. Its
    wrapped handlers are built once per method, so the interceptors before it (the
    authorization table's) are handed the same object every call and keep theirs too."""

    def __init__(self) -> None:
        self._wrapped = WrappedHandlers(self._wrap)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._wrapped.get(handler_call_details.method, handler)  # type: ignore[attr-defined]

    @staticmethod
    def _wrap(method: str, handler: Any) -> Any:
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                _guard_unary(method, handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _guard_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


class ServiceServer:
    """A started gRPC server with health and reflection; ``port`` is the bound port."""

    def __init__(
        self,
        server: grpc.Server,
        port: int,
        health_servicer: health.HealthServicer,
        names: Sequence[str],
        health_only: grpc.Server | None = None,
        health_port: int | None = None,
    ) -> None:
        self.server = server
        self.port = port
        self.health = health_servicer
        self.names = list(names)
        self.health_only = health_only
        self.health_port = health_port
        self._stopping = False

    def set_serving(self, serving: bool) -> None:
        """Answer the health check SERVING or NOT_SERVING (the database watch's view while
        it runs); once stopping, NOT_SERVING whatever is reported after."""
        if serving and self._stopping:
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in _health_names(self.names, serving, self._stopping):
            self.health.set(name, status)

    def stop(self, grace: float = 5.0) -> None:
        """Refuse new calls, let running ones finish for ``grace`` seconds, then stop."""
        self._stopping = True
        self.set_serving(False)
        if self.health_only is not None:
            self.health_only.stop(0)
        self.server.stop(grace).wait()

    def wait_for_termination(self) -> None:
        self.server.wait_for_termination()


def _health_names(names: Sequence[str], serving: bool, stopping: bool) -> list[str]:
    """The names a change of serving sets: readiness's ("" and each service's) always;
    liveness's only at the start (SERVING) and at the stop (NOT_SERVING)."""
    alive = [LIVENESS_SERVICE] if serving or stopping else []
    return [*names, "", *alive]


def _interceptors(transport: Transport, aio: bool) -> list[Any]:
    """The authorization table, after the call durations and tracing (so a refused call is
    measured and traced too) and before the error mapping. Insecure development servers
    have no identity to check."""
    if transport.insecure:
        return []
    gate = Gate(transport.deployment)
    return [AioAuthorizationInterceptor(gate) if aio else AuthorizationInterceptor(gate)]


def _bind(server: grpc.Server | grpc.aio.Server, transport: Transport, address: str) -> int:
    port = transport.add_port(server, address)
    if port == 0:
        raise RuntimeError(f"could not bind gRPC server to {address}")
    return port


def create_health_only_server(address: str, health_servicer: Any) -> tuple[grpc.Server, int]:
    """A plaintext port that answers the standard health check and nothing else, for an
    orchestrator's probe (which holds no certificate). It shares the main server's health
    status; every other method is UNIMPLEMENTED there."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.so_reuseport", 0)])
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    if port == 0:
        raise RuntimeError(f"could not bind the health port to {address}")
    server.start()
    return server, port


def create_server(
    address: str,
    bindings: Sequence[ServiceBinding],
    *,
    transport: Transport,
    max_workers: int = 32,
    health_address: str | None = None,
    instruments: Instruments = PROCESS,
) -> ServiceServer:
    """Build, bind and start a server; returns it with the port actually bound.

    With TLS the server requires a client certificate of the deployment's CA and checks
    every call against the authorization table; ``health_address`` adds the plaintext
    health-only port. Call durations are recorded through ``instruments``."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers),
        interceptors=[
            ServerCallDurations(instruments),
            server_interceptor(),
            *_interceptors(transport, aio=False),
            ErrorMappingInterceptor(),
        ],
        options=[("grpc.so_reuseport", 0)],
    )
    for binding in bindings:
        binding.add(binding.servicer, server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [b.full_name for b in bindings]
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    port = _bind(server, transport, address)
    server.start()
    health_only, health_port = (
        create_health_only_server(health_address, health_servicer) if health_address else (None, None)
    )
    result = ServiceServer(server, port, health_servicer, names, health_only, health_port)
    result.set_serving(True)
    return result


def run_until_signalled(
    server: ServiceServer | AioServiceServer, stop: threading.Event, grace: float = 5.0
) -> None:
    """Block until SIGTERM/SIGINT, then stop loops (``stop``) and the server gracefully."""

    stop_on_signals(stop, log.info)
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


# ---- the asyncio server: streams that hold no thread, lanes no other caller can fill --------


@dataclass(frozen=True)
class Lane:
    """A bounded executor of its own for one service's unary calls: a flood of other
    callers queues in their lane, never in this one (the scheduler's WorkerService)."""

    service: str  # full name, e.g. gpufleet.v1.WorkerService
    workers: int


def _guard_async_unary(method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await behavior(request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _answer_async(context, method, error)
        return None

    return wrapper


def _guard_async_stream(method: str, behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    """Any shape of response stream (see :func:`~gpufleet.common.aio_handlers.responses`),
    as an async generator."""

    async def wrapper(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        try:
            async for item in responses(behavior(request, context)):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await _answer_async(context, method, error)

    return wrapper


async def _answer_async(context: grpc.aio.ServicerContext[Any, Any], method: str, error: Exception) -> None:
    """The status a handler's exception ends its call with (each branch aborts, which
    raises): a GpufleetError's own; a known failure's (the database's loss); the one the
    handler chose before it raised (a generated
    servicer's method the service does not implement sets UNIMPLEMENTED, then raises
    NotImplementedError); else INTERNAL, the one case logged with its stack."""
    chosen = context.code()
    if isinstance(error, GpufleetError):
        await _abort_async(context, error)
    elif (known := _known(method, error)) is not None:
        await _abort_async(context, known)
    elif isinstance(chosen, grpc.StatusCode) and chosen is not grpc.StatusCode.OK:
        details = context.details() or chosen.value[1]
        log.info("%s answered %s: %s", method, chosen.name, details)
        await context.abort(chosen, details)
    else:
        log.error("unexpected error in %s", method, exc_info=error)
        await context.abort(grpc.StatusCode.INTERNAL, "internal error; see server logs")


async def _abort_async(context: grpc.aio.ServicerContext[Any, Any], err: GpufleetError) -> None:
    status = status_of(err)
    await context.abort(status.code, status.details, (*_set_already(context), *status.trailing_metadata))


class AioErrorMappingInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc,type-arg]
    """The asyncio twin of :class:`ErrorMappingInterceptor`; it also puts each lane's
    service on its own executor, and every other synchronous unary handler on the default
    one. A response stream of any shape is made an async generator on the loop (see
    :mod:`gpufleet.common.aio_handlers`)."""

    def __init__(
        self, lanes: dict[str, futures.ThreadPoolExecutor], default: futures.ThreadPoolExecutor
    ) -> None:
        self.lanes = lanes
        self.default = default
        self._wrapped = WrappedHandlers(self._wrap)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._wrapped.get(handler_call_details.method, handler)  # type: ignore[attr-defined]

    def _wrap(self, method: str, handler: Any) -> Any:
        service = method.split("/")[1] if method.count("/") == 2 else ""
        lane = self.lanes.get(service, self.default)
        if handler.unary_unary:
            behavior = handler.unary_unary
            if not inspect.iscoroutinefunction(behavior):
                # Every handler the loop sees is a coroutine (the tracing interceptor
                # awaits it); a synchronous one runs on its lane's executor.
                behavior = on_lane(behavior, lane)
            return grpc.unary_unary_rpc_method_handler(
                _guard_async_unary(method, behavior),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _guard_async_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler


class AioServiceServer:
    """An asyncio gRPC server run on an event loop of its own thread, with the interface
    of :class:`ServiceServer` (so the runtime drives either the same way)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        server: grpc.aio.Server,
        port: int,
        health_servicer: Any,
        names: Sequence[str],
        executors: Sequence[futures.ThreadPoolExecutor],
        health_only: grpc.aio.Server | None = None,
        health_port: int | None = None,
    ) -> None:
        self.health_only = health_only
        self.health_port = health_port
        self.loop = loop
        self.thread = thread
        self.server = server
        self.port = port
        self.health = health_servicer
        self.names = list(names)
        self.executors = list(executors)
        self._stopping = False

    def _run(self, coro: Any, timeout: float | None = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def set_serving(self, serving: bool) -> None:
        if serving and self._stopping:
            return
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )

        names = _health_names(self.names, serving, self._stopping)

        async def mark() -> None:
            for name in names:
                await self.health.set(name, status)

        if not self.loop.is_running():
            return  # stopped: nothing left to answer a health check
        self._run(mark())

    def stop(self, grace: float = 5.0) -> None:
        if not self.loop.is_running():
            return
        self._stopping = True
        self.set_serving(False)
        if self.health_only is not None:
            self._run(self.health_only.stop(0))
        self._run(self.server.stop(grace), timeout=grace + 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        for executor in self.executors:
            executor.shutdown(wait=False, cancel_futures=True)

    def wait_for_termination(self) -> None:
        self.thread.join()


def create_aio_server(
    address: str,
    bindings: Sequence[ServiceBinding],
    *,
    transport: Transport,
    max_workers: int = 32,
    lanes: Sequence[Lane] = (),
    reuse_port: bool = False,
    health_address: str | None = None,
    instruments: Instruments = PROCESS,
) -> AioServiceServer:
    """Build, bind and start an asyncio server on a loop thread of its own. Async handlers
    run on the loop (a stream waiting on its client holds no thread); synchronous ones in
    a pool of ``max_workers``; a lane's service in its own executor.

    ``reuse_port`` lets other processes of the same service bind the same port (the
    scheduler's API processes); off, a second server on a taken port fails to start
    rather than silently sharing its traffic."""
    from grpc_health.v1 import _async as health_async
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    loop = asyncio.new_event_loop()
    executors = {
        lane.service: futures.ThreadPoolExecutor(lane.workers, f"lane-{lane.service}") for lane in lanes
    }
    api = futures.ThreadPoolExecutor(max_workers, "grpc-api")
    migration = futures.ThreadPoolExecutor(4, "grpc-sync-streams")
    started: futures.Future[tuple[grpc.aio.Server, int, Any, grpc.aio.Server | None, int | None]] = (
        futures.Future()
    )

    async def build() -> None:
        server = grpc.aio.server(
            migration_thread_pool=migration,
            interceptors=[
                AioServerCallDurations(instruments),
                aio_server_interceptor(),
                *_interceptors(transport, aio=True),
                AioErrorMappingInterceptor(executors, api),
            ],
            options=[("grpc.so_reuseport", 1 if reuse_port else 0)],
        )
        for binding in bindings:
            # The generated add_*_to_server functions take either kind of server.
            binding.add(binding.servicer, server)  # type: ignore[arg-type]
        health_servicer = health_async.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        names = [b.full_name for b in bindings]
        reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
        port = _bind(server, transport, address)
        await server.start()
        health_only: grpc.aio.Server | None = None
        health_port: int | None = None
        if health_address:
            # The orchestrator's plaintext probe: the health service alone, same status.
            health_only = grpc.aio.server(options=[("grpc.so_reuseport", 1 if reuse_port else 0)])
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, health_only)
            health_port = health_only.add_insecure_port(health_address)
            if health_port == 0:
                raise RuntimeError(f"could not bind the health port to {health_address}")
            await health_only.start()
        started.set_result((server, port, health_servicer, health_only, health_port))

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(build())
        except BaseException as exc:
            started.set_exception(exc)
            return
        loop.run_forever()

    thread = threading.Thread(target=run, name="grpc-aio", daemon=True)
    thread.start()
    server, port, health_servicer, health_only, health_port = started.result(timeout=30)
    result = AioServiceServer(
        loop,
        thread,
        server,
        port,
        health_servicer,
        [b.full_name for b in bindings],
        [api, migration, *executors.values()],
        health_only,
        health_port,
    )
    result.set_serving(True)
    return result
