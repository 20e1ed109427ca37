"""The one interceptor that enforces the authorization table on every server.

A call whose peer proved no identity of this deployment is refused ``UNAUTHENTICATED``;
one whose role the table does not allow, ``PERMISSION_DENIED``. Each refusal is logged
with the method and the caller and counted by method and reason. A caller with no
certificate, or one of another CA, never gets this far: the TLS handshake refuses it.

On a server run insecure for development there is no identity to check: the
interceptor is not installed, and every log line of the process says ``insecure``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc

from gpufleet.common.aio_handlers import responses
from gpufleet.common.errors import GpufleetError, PermissionDenied, Unauthenticated
from gpufleet.common.handler_cache import WrappedHandlers
from gpufleet.common.metrics.catalog import AUTH_REFUSALS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.rich_status import status_of
from gpufleet.common.trust import authz
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.peer import certificate_pem, identity_from_auth_context

log = logging.getLogger(__name__)


# Decisions kept at most (a certificate and a method each); past it they are made again.
_ALLOWED_MAX = 4096


class Refused(Exception):
    """A refusal, carrying the error a caller reads: its code, its message and its
    ErrorInfo reason (``UNAUTHENTICATED``, ``NO_RULE``, ``WRONG_ROLE``; domain
    ``gpufleet.dev``), sent as the rich status every other error of ours is."""

    def __init__(self, error: GpufleetError) -> None:
        super().__init__(error.message)
        self.error = error
        self.code = error.code
        self.message = error.message

    def status(self) -> grpc.Status:
        return status_of(self.error)


class Gate:
    """The check, the same for both kinds of server.

    Every call on a connection carries the certificate its handshake verified, and that
    identity cannot change while the connection lasts; so a method is decided once per
    certificate — on the connection's first call of it — and later calls only find the
    decision by the certificate they present. Keyed by the certificate itself (not by the
    peer's address, which a later connection may reuse with another certificate), a
    found decision is exactly the one the full check would make. Only allowances are
    kept: every refusal is checked, logged and counted again."""

    def __init__(
        self,
        deployment: str,
        rules: Mapping[str, frozenset[Role]] = authz.RULES,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.deployment = deployment
        self.rules = rules
        self._refusals = instruments.counter(AUTH_REFUSALS)
        # (method, certificate PEM) -> the identity allowed. Plain dict operations are
        # atomic, so threads racing on a first call decide twice at worst, alike.
        self._allowed: dict[tuple[str, bytes], Identity] = {}

    def check(self, method: str, auth: Any, peer: str) -> Identity:
        pem = certificate_pem(auth)
        if pem is not None:
            allowed = self._allowed.get((method, pem))
            if allowed is not None:
                return allowed
        identity = self._decide(method, auth, peer)
        if pem is not None:
            if len(self._allowed) >= _ALLOWED_MAX:
                self._allowed.clear()
            self._allowed[(method, pem)] = identity
        return identity

    def _decide(self, method: str, auth: Any, peer: str) -> Identity:
        identity = identity_from_auth_context(auth)
        if identity is None or identity.deployment != self.deployment:
            self._refuse(method, "unauthenticated", peer, str(identity) if identity else "no identity")
            raise Refused(
                Unauthenticated(
                    f"{method}: the caller's certificate names no identity of deployment {self.deployment}",
                    reason="UNAUTHENTICATED",
                )
            )
        decision = authz.decide(method, identity, self.rules)
        if not decision.allowed:
            self._refuse(method, decision.verdict.value, peer, str(identity))
            raise Refused(PermissionDenied(decision.reason, reason=decision.verdict.name))
        return identity

    def _refuse(self, method: str, reason: str, peer: str, who: str) -> None:
        self._refusals.add(1, {"method": method, "reason": reason})
        log.warning(
            "refused %s to %s (%s)",
            method,
            who,
            reason,
            extra={"fields": {"method": method, "caller": who, "peer": peer, "refusal": reason}},
        )


def _method_of(details: grpc.HandlerCallDetails) -> str:
    return str(details.method)  # type: ignore[attr-defined]


class AuthorizationInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg,misc]
    """Threaded servers: each handler checks its caller before it runs."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._wrapped = WrappedHandlers(self._wrap)

    def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        return self._wrapped.get(_method_of(details), handler)

    def _wrap(self, method: str, handler: Any) -> Any:
        gate = self.gate

        def allowed(context: grpc.ServicerContext) -> None:
            try:
                gate.check(method, context.auth_context(), context.peer())
            except Refused as refused:
                status = refused.status()
                context.set_trailing_metadata(status.trailing_metadata)
                context.abort(status.code, status.details)

        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                allowed(context)
                return inner(request, context)

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            def stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                allowed(context)
                yield from inner_stream(request, context)

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        if handler.stream_stream:  # reflection
            inner_bidi = handler.stream_stream

            def bidi(requests: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                allowed(context)
                yield from inner_bidi(requests, context)

            return grpc.stream_stream_rpc_method_handler(
                bidi, handler.request_deserializer, handler.response_serializer
            )
        return _refuse_unknown_shape(method)


def _refuse_unknown_shape(method: str) -> Any:
    def refuse(_request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: no authorization for this kind of call")

    return grpc.stream_unary_rpc_method_handler(refuse)


class AioAuthorizationInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc,type-arg]
    """The asyncio twin: the check runs on the loop, before the handler is scheduled."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self._wrapped = WrappedHandlers(self._wrap)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Any], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        return self._wrapped.get(_method_of(details), handler)

    def _wrap(self, method: str, handler: Any) -> Any:
        gate = self.gate

        async def allowed(context: grpc.aio.ServicerContext[Any, Any]) -> None:
            try:
                gate.check(method, context.auth_context(), context.peer())
            except Refused as refused:
                status = refused.status()
                await context.abort(status.code, status.details, status.trailing_metadata)

        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await allowed(context)
                result = inner(request, context)
                return await result if inspect.isawaitable(result) else result

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        streaming = handler.unary_stream or handler.stream_stream
        if streaming:
            make = (
                grpc.unary_stream_rpc_method_handler
                if handler.unary_stream
                else grpc.stream_stream_rpc_method_handler
            )

            async def stream(request_or_requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await allowed(context)
                # Any shape of stream handler: an async generator, a coroutine writing to
                # its context (health's Watch), a function returning an iterator.
                async for item in responses(streaming(request_or_requests, context)):
                    yield item

            return make(stream, handler.request_deserializer, handler.response_serializer)
        return _refuse_unknown_shape(method)
