"""How long each gRPC call took, server side and client side, as OpenTelemetry's semantic
conventions define it (``rpc.server.call.duration``, ``rpc.client.call.duration``).

Why gpufleet records these itself: ``opentelemetry-instrumentation-grpc`` (the version
pinned with the rest of OpenTelemetry) makes spans only, no metric. So two interceptors
here record what the conventions describe, with their attribute keys, through the metrics
catalogue (:data:`~gpufleet.common.metrics.catalog.RPC_SERVER_CALL_DURATION`):

- ``rpc.system.name`` ``grpc``; ``rpc.method`` the fully qualified method
  (``gpufleet.v1.JobService/SubmitJob``), on a server ``_OTHER`` for a name it does not
  serve — a caller chooses that name, and each would be a series;
- ``rpc.response.status_code`` the status code's name; ``error.type`` on a failure only,
  as the gRPC conventions count failures: on a server the six codes that mean the server
  failed (a refused or invalid call is the caller's), on a client every code but ``OK``,
  or the exception's class when a call failed before it had a status.

Never the peer's address nor the server's: a server hears from every machine, and a
scheduler calls every machine's agent.

The server interceptor goes first, so a call the authorization table refuses is measured
too; it times the handler as the tracing interceptor after it does its span. A recording
that fails never fails the call it measures (strict instruments, in tests, raise).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc

from gpufleet.common.handler_cache import WrappedHandlers
from gpufleet.common.metrics.catalog import (
    ERROR_TYPE,
    RPC_CLIENT_CALL_DURATION,
    RPC_METHOD,
    RPC_RESPONSE_STATUS_CODE,
    RPC_SERVER_CALL_DURATION,
    RPC_SYSTEM_NAME,
)
from gpufleet.common.metrics.instruments import PROCESS, Histogram, Instruments

__all__ = ["AioServerCallDurations", "ClientCallDurations", "ServerCallDurations"]

log = logging.getLogger(__name__)

GRPC = "grpc"
# What the conventions call a method the server does not recognise.
OTHER_METHOD = "_OTHER"
# The codes that say the server failed (the gRPC conventions' list); the others are answers.
_SERVER_FAILURES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def method_name(path: str) -> str:
    """``/gpufleet.v1.JobService/SubmitJob`` as the conventions write it."""
    return path.removeprefix("/")


def _class_name(error: BaseException) -> str:
    kind = type(error)
    return f"{kind.__module__}.{kind.__qualname__}"


class _Durations:
    """One histogram and how a call's outcome is labelled; a recording that fails is logged
    and never reaches the call (unless the instruments are strict)."""

    def __init__(self, histogram: Histogram, strict: bool, failures: Callable[[grpc.StatusCode], bool]):
        self._histogram = histogram
        self._strict = strict
        self._failures = failures

    def after_handler(self, method: str, started: float, context: Any, otherwise: grpc.StatusCode) -> None:
        """A server's call: the status its handler set (an abort sets it too); else, when the
        call ended under the handler, how (a stream's source may just stop then); else
        ``otherwise`` (``OK`` when it returned, ``UNKNOWN`` when it raised: gRPC's answer)."""
        elapsed = time.perf_counter() - started
        try:
            code = context.code() if context is not None else None
            if not isinstance(code, grpc.StatusCode):
                code = (
                    _cut_short(context, ended=otherwise is grpc.StatusCode.CANCELLED)
                    if otherwise is not grpc.StatusCode.UNKNOWN
                    else None
                )
            self._record(method, elapsed, code or otherwise, None)
        except Exception:
            self._failed(method)

    def after_call(self, method: str, started: float, outcome: Any) -> None:
        """A client's call, from its completed future."""
        elapsed = time.perf_counter() - started
        try:
            code, error = _client_outcome(outcome)
            self._record(method, elapsed, code, error)
        except Exception:
            self._failed(method)

    def _record(
        self, method: str, elapsed: float, code: grpc.StatusCode | None, error: BaseException | None
    ) -> None:
        labels: dict[str, str] = {RPC_SYSTEM_NAME.key: GRPC, RPC_METHOD.key: method}
        if code is not None:
            labels[RPC_RESPONSE_STATUS_CODE.key] = code.name
            if self._failures(code):
                labels[ERROR_TYPE.key] = code.name
        elif error is not None:
            labels[ERROR_TYPE.key] = _class_name(error)
        self._histogram.record(elapsed, labels)

    def _failed(self, method: str) -> None:
        """Called while the recording's exception is handled."""
        if self._strict:
            raise
        log.exception("rpc call duration of %s not recorded", method)


# -- the server -------------------------------------------------------------------------------


def _cut_short(context: Any, ended: bool = False) -> grpc.StatusCode | None:
    """How the call ended while its handler still ran, if it did (``ended``: known to have,
    as when an asyncio handler was cancelled under it): its deadline passed, or the caller
    cancelled it (a server cannot tell a deadline the caller's library enforced apart from
    a cancel, but it knows its own clock)."""
    if context is None:
        return None
    if not ended:
        threaded = hasattr(context, "is_active")  # an asyncio context says cancelled() instead
        ended = not context.is_active() if threaded else bool(context.cancelled())
    if not ended:
        return None
    remaining = context.time_remaining()
    return (
        grpc.StatusCode.DEADLINE_EXCEEDED
        if remaining is not None and remaining <= 0
        else grpc.StatusCode.CANCELLED
    )


class _ServerTimer:
    """Wraps a method's handler so that each call through it is timed. A handler's
    behaviour returns (a unary response) or yields (a response stream); on an asyncio
    server either may be a coroutine. The wrapped handler keeps the shape it had."""

    def __init__(self, instruments: Instruments) -> None:
        self.durations = _Durations(
            instruments.histogram(RPC_SERVER_CALL_DURATION),
            instruments.strict,
            lambda code: code in _SERVER_FAILURES,
        )
        self.handlers = WrappedHandlers(self._wrap)

    def unknown(self, started: float) -> None:
        """A call to no method this server serves: gRPC answers it UNIMPLEMENTED."""
        self.durations.after_handler(OTHER_METHOD, started, None, grpc.StatusCode.UNIMPLEMENTED)

    def _wrap(self, path: str, handler: Any) -> Any:
        method = method_name(path)
        shapes = (
            (handler.unary_unary, grpc.unary_unary_rpc_method_handler),
            (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
            (handler.stream_unary, grpc.stream_unary_rpc_method_handler),
            (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
        )
        for behavior, make in shapes:
            if behavior is not None:
                return make(
                    self._timed(method, behavior, handler.response_streaming),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler

    def _timed(self, method: str, behavior: Callable[..., Any], streams: bool) -> Callable[..., Any]:
        """By what the behaviour is, not only by the method's shape: a response stream is
        an async generator, a coroutine writing to its context, or a function returning
        any iterator (the threaded health service's Watch)."""
        if inspect.isasyncgenfunction(behavior):
            return self._async_stream(method, behavior)
        if inspect.iscoroutinefunction(behavior):
            return self._async_unary(method, behavior)
        if streams:
            return self._stream(method, behavior)
        return self._unary(method, behavior)

    def _unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        after = self.durations.after_handler

        def timed(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                response = behavior(request, context)
            except BaseException:
                after(method, started, context, grpc.StatusCode.UNKNOWN)
                raise
            after(method, started, context, grpc.StatusCode.OK)
            return response

        return timed

    def _stream(self, method: str, behavior: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        after = self.durations.after_handler

        def timed(request: Any, context: Any) -> Iterator[Any]:
            started = time.perf_counter()
            otherwise = grpc.StatusCode.UNKNOWN
            try:
                yield from behavior(request, context)
                otherwise = grpc.StatusCode.OK
            except GeneratorExit:  # closed before its end: the call is over, the client left
                otherwise = grpc.StatusCode.CANCELLED
                raise
            finally:
                after(method, started, context, otherwise)

        return timed

    def _async_unary(self, method: str, behavior: Callable[..., Any]) -> Callable[..., Any]:
        after = self.durations.after_handler

        async def timed(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                response = await behavior(request, context)
            except BaseException as error:
                after(method, started, context, _async_failure(error))
                raise
            after(method, started, context, grpc.StatusCode.OK)
            return response

        return timed

    def _async_stream(
        self, method: str, behavior: Callable[..., AsyncIterator[Any]]
    ) -> Callable[..., AsyncIterator[Any]]:
        after = self.durations.after_handler

        async def timed(request: Any, context: Any) -> AsyncIterator[Any]:
            started = time.perf_counter()
            otherwise = grpc.StatusCode.UNKNOWN
            try:
                async for item in behavior(request, context):
                    yield item
                otherwise = grpc.StatusCode.OK
            except BaseException as error:
                otherwise = _async_failure(error)
                raise
            finally:
                after(method, started, context, otherwise)

        return timed


def _async_failure(error: BaseException) -> grpc.StatusCode:
    """A coroutine cancelled under its call was cancelled by the client (or its deadline)."""
    return grpc.StatusCode.CANCELLED if isinstance(error, asyncio.CancelledError) else grpc.StatusCode.UNKNOWN


class ServerCallDurations(grpc.ServerInterceptor):  # type: ignore[type-arg,misc]
    """Threaded servers: ``rpc.server.call.duration`` for every call."""

    def __init__(self, instruments: Instruments = PROCESS) -> None:
        self._timer = _ServerTimer(instruments)

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        started = time.perf_counter()
        handler = continuation(details)
        if handler is None:
            self._timer.unknown(started)
            return None
        return self._timer.handlers.get(details.method, handler)  # type: ignore[attr-defined]


class AioServerCallDurations(grpc.aio.ServerInterceptor):  # type: ignore[misc,type-arg]
    """The asyncio twin of :class:`ServerCallDurations`."""

    def __init__(self, instruments: Instruments = PROCESS) -> None:
        self._timer = _ServerTimer(instruments)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        started = time.perf_counter()
        handler = await continuation(details)
        if handler is None:
            self._timer.unknown(started)
            return None
        return self._timer.handlers.get(details.method, handler)  # type: ignore[attr-defined]


# -- the client -------------------------------------------------------------------------------


class ClientCallDurations(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg,misc]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg,misc]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg,misc]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg,misc]
):
    """``rpc.client.call.duration`` for every call made on a channel: timed from the call's
    start to its outcome (a blocking call's is there when the continuation returns; a
    future's or a stream's when it completes)."""

    def __init__(self, instruments: Instruments = PROCESS) -> None:
        self._durations = _Durations(
            instruments.histogram(RPC_CLIENT_CALL_DURATION),
            instruments.strict,
            lambda code: code is not grpc.StatusCode.OK,
        )

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        started = time.perf_counter()
        return self._when_done(details, started, continuation(details, request))

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        started = time.perf_counter()
        return self._when_done(details, started, continuation(details, request))

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        started = time.perf_counter()
        return self._when_done(details, started, continuation(details, request_iterator))

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        started = time.perf_counter()
        return self._when_done(details, started, continuation(details, request_iterator))

    def _when_done(self, details: Any, started: float, call: Any) -> Any:
        method = method_name(str(details.method))
        call.add_done_callback(lambda outcome: self._durations.after_call(method, started, outcome))
        return call


def _client_outcome(outcome: Any) -> tuple[grpc.StatusCode | None, BaseException | None]:
    """The call's status code, or the exception that ended it before it had one."""
    if outcome.cancelled():
        return grpc.StatusCode.CANCELLED, None
    error = outcome.exception()
    if error is not None and not isinstance(error, grpc.RpcError):
        return None, error
    code = outcome.code()
    return (code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN), None
