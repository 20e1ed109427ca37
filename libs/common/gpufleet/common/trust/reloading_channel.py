"""A client channel that follows its process's certificate files.

gRPC for Python fixes a channel's credentials when the channel is made, and reconnects
with them for the channel's whole life: there is no certificate provider a Python client can
hand it (grpcio 1.85 exposes C core's file-watching provider to no Python API). A process's
channels live for days (the scheduler's to each agent and to the provisioner, the agent's to
the scheduler), longer than a certificate that is renewed every few weeks, and a renewed
trust bundle may be needed to check a server's renewed certificate.

So a :class:`ReloadingChannel` holds an ordinary secure channel made from the material in
force, and when the files change it makes a new one for the calls that follow. Calls
already going on keep the channel — and the connection — they started on; an old channel
is closed with this one (until then it goes idle and lets its connection go, after
``grpc.client_idle_timeout_ms``: 30 minutes by default). Stubs, interceptors and
``grpc.intercept_channel`` use it as any channel: each multi-callable it hands out finds
the channel in force at each call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import grpc

from gpufleet.common.trust.material import TlsMaterial
from gpufleet.common.trust.reload import TlsReloader


def channel_credentials(material: TlsMaterial) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=material.ca, private_key=material.key, certificate_chain=material.cert
    )


class ReloadingChannel(grpc.Channel):
    """A secure channel to ``address`` whose server must prove ``server_name``, opened
    with the newest certificate ``reloader`` holds."""

    def __init__(
        self, address: str, server_name: str, options: Sequence[tuple[str, Any]], reloader: TlsReloader
    ) -> None:
        self.address = address
        self._options = [*options, ("grpc.ssl_target_name_override", server_name)]
        self._reloader = reloader
        self._lock = threading.Lock()
        self._material = reloader.current()
        self._channel = self._open(self._material)
        self._retired: list[grpc.Channel] = []
        self._closed = False

    def _open(self, material: TlsMaterial) -> grpc.Channel:
        return grpc.secure_channel(self.address, channel_credentials(material), options=self._options)

    def current(self) -> grpc.Channel:
        """The channel the next call goes on: a new one when the files have changed."""
        material = self._reloader.current()
        if material is self._material:
            return self._channel
        with self._lock:
            if material is not self._material and not self._closed:
                self._retired.append(self._channel)
                self._channel = self._open(material)
                self._material = material
            return self._channel

    @property
    def channels_opened(self) -> int:
        """How many channels this one has made (1 + one for each change taken)."""
        return 1 + len(self._retired)

    def unary_unary(  # type: ignore[override]
        self,
        method: str,
        request_serializer: Callable[..., Any] | None = None,
        response_deserializer: Callable[..., Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.UnaryUnaryMultiCallable:  # type: ignore[type-arg]
        return _UnaryUnary(
            self,
            lambda ch: ch.unary_unary(method, request_serializer, response_deserializer, _registered_method),  # type: ignore[call-arg]
        )

    def unary_stream(  # type: ignore[override]
        self,
        method: str,
        request_serializer: Callable[..., Any] | None = None,
        response_deserializer: Callable[..., Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.UnaryStreamMultiCallable:  # type: ignore[type-arg]
        return _UnaryStream(
            self,
            lambda ch: ch.unary_stream(method, request_serializer, response_deserializer, _registered_method),  # type: ignore[call-arg]
        )

    def stream_unary(  # type: ignore[override]
        self,
        method: str,
        request_serializer: Callable[..., Any] | None = None,
        response_deserializer: Callable[..., Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.StreamUnaryMultiCallable:  # type: ignore[type-arg]
        return _StreamUnary(
            self,
            lambda ch: ch.stream_unary(method, request_serializer, response_deserializer, _registered_method),  # type: ignore[call-arg]
        )

    def stream_stream(  # type: ignore[override]
        self,
        method: str,
        request_serializer: Callable[..., Any] | None = None,
        response_deserializer: Callable[..., Any] | None = None,
        _registered_method: bool | None = False,
    ) -> grpc.StreamStreamMultiCallable:  # type: ignore[type-arg]
        return _StreamStream(
            self,
            lambda ch: ch.stream_stream(
                method, request_serializer, response_deserializer, _registered_method
            ),  # type: ignore[call-arg]
        )

    def subscribe(
        self, callback: Callable[[grpc.ChannelConnectivity], None], try_to_connect: bool = False
    ) -> None:
        self.current().subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable[[grpc.ChannelConnectivity], None]) -> None:
        with self._lock:
            channels = [self._channel, *self._retired]
        for channel in channels:
            channel.unsubscribe(callback)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels = [self._channel, *self._retired]
            self._retired = []
        for channel in channels:
            channel.close()

    def __enter__(self) -> ReloadingChannel:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        self.close()


class _Following:
    """The multi-callable of the channel in force, made again when that channel changes."""

    def __init__(self, owner: ReloadingChannel, make: Callable[[grpc.Channel], Any]) -> None:
        self._owner = owner
        self._make = make
        self._pair: tuple[grpc.Channel, Any] | None = None

    def _target(self) -> Any:
        channel = self._owner.current()
        pair = self._pair
        if pair is None or pair[0] is not channel:
            pair = self._pair = (channel, self._make(channel))
        return pair[1]


class _UnaryUnary(_Following, grpc.UnaryUnaryMultiCallable):  # type: ignore[type-arg,misc]
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._target().with_call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._target().future(*args, **kwargs)


class _UnaryStream(_Following, grpc.UnaryStreamMultiCallable):  # type: ignore[type-arg,misc]
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)


class _StreamUnary(_Following, grpc.StreamUnaryMultiCallable):  # type: ignore[type-arg,misc]
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)

    def with_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._target().with_call(*args, **kwargs)

    def future(self, *args: Any, **kwargs: Any) -> Any:
        return self._target().future(*args, **kwargs)


class _StreamStream(_Following, grpc.StreamStreamMultiCallable):  # type: ignore[type-arg,misc]
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._target()(*args, **kwargs)
