"""A loopback TCP proxy that can lose one answer: the connection a call went out on is cut
as the server starts answering, so the client sees UNAVAILABLE for a call the server may
well have done — the case an idempotency key is for."""

from __future__ import annotations

import threading

from tests.support.loopback_relay import LoopbackRelay


class CuttingProxy(LoopbackRelay):
    """Forwards 127.0.0.1:``port`` to the server at ``target``, byte for byte (TLS passes
    through untouched). After :meth:`cut_next_answer`, the first bytes the server sends are
    dropped and both sides of that connection are closed."""

    def __init__(self, target: str) -> None:
        self.cuts = 0
        self._armed = threading.Event()
        super().__init__(target)

    def cut_next_answer(self) -> None:
        self._armed.set()

    def passes(self, answers: bool) -> bool:
        if answers and self._armed.is_set():
            self._armed.clear()
            with self._lock:
                self.cuts += 1
            return False
        return True
