"""Paged List calls as iterators of their items, sync and asyncio.

A page is fetched only when the caller reaches it, so a loop that stops early costs no
more calls; ``next_page_token`` is followed until the server sends an empty one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

# page_token -> (the page's items, the next page's token: empty on the last page)
Fetch = Callable[[str], tuple[Sequence[T], str]]
AsyncFetch = Callable[[str], Awaitable[tuple[Sequence[T], str]]]


def items(fetch: Fetch[T]) -> Iterator[T]:
    token = ""
    while True:
        page, token = fetch(token)
        yield from page
        if not token:
            return


async def aitems(fetch: AsyncFetch[T]) -> AsyncIterator[T]:
    token = ""
    while True:
        page, token = await fetch(token)
        for item in page:
            yield item
        if not token:
            return
