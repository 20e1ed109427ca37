"""The handlers an asyncio gRPC server is given, as the skeleton's wrappers (the error
mapping, the authorization table) run them.

A response stream's handler comes in three shapes: an async generator; a coroutine that
writes its answers to its context and returns nothing (the asyncio health service's
``Watch``); a function returning an iterator. The tracing interceptor around the
skeleton's wrappers iterates whatever a stream handler returns, so :func:`responses`
makes each shape an async generator: a writer's answers go out as it writes them and the
generator yields none.

A synchronous unary handler runs on an executor (its lane), where it must not touch the
call's asyncio context: it gets a :class:`LaneContext` instead, and the status it chose
there (a generated servicer's method the service does not implement sets
``UNIMPLEMENTED``) is set on the call's context when it returns or raises.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable
from concurrent import futures
from typing import Any

import grpc

__all__ = ["LaneContext", "on_lane", "responses"]


async def responses(produced: Any) -> AsyncIterator[Any]:
    """What a response stream's handler returned, as an async generator."""
    if inspect.isawaitable(produced):
        # A writer: its answers were written to the call by the time it returns.
        await produced
        return
    if hasattr(produced, "__aiter__"):
        async for item in produced:
            yield item
        return
    # A synchronous iterator (none in the services): each item is made on the loop.
    for item in produced:
        yield item


class LaneContext:
    """What a lane's handler may do with its call's context from a thread: read who called,
    and choose the status (``set_code``, ``set_details``) the call ends with."""

    __slots__ = ("_auth", "_code", "_details", "_metadata", "_peer")

    def __init__(self, context: Any) -> None:
        self._peer = context.peer()
        self._metadata = tuple(context.invocation_metadata() or ())
        self._auth = context.auth_context()
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None

    def peer(self) -> str:
        return str(self._peer)

    def invocation_metadata(self) -> tuple[Any, ...]:
        return self._metadata

    def is_active(self) -> bool:
        return True

    def auth_context(self) -> Any:
        """Who called (the verified certificate's properties), for a check only the
        handler can make: a machine reporting for itself."""
        return self._auth

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details

    def chosen_onto(self, context: Any) -> None:
        """Set the status the handler chose on the call's own context (on the loop)."""
        if self._code is not None:
            context.set_code(self._code)
        if self._details is not None:
            context.set_details(self._details)


def on_lane(behavior: Callable[..., Any], executor: futures.ThreadPoolExecutor) -> Callable[..., Any]:
    """A synchronous unary handler run on its lane's executor, awaited by the event loop."""

    async def call(request: Any, context: Any) -> Any:
        lane_context = LaneContext(context)
        try:
            result = await asyncio.get_running_loop().run_in_executor(
                executor, behavior, request, lane_context
            )
        except asyncio.CancelledError:  # the call is over: no status of the handler's to send
            raise
        except BaseException:
            lane_context.chosen_onto(context)
            raise
        lane_context.chosen_onto(context)
        return result

    return call
