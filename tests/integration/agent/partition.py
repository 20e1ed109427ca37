"""A loopback TCP path that can be cut like a network partition: once cut, nothing passes
either way and nothing is refused — calls hang until their deadline, as they do when a
machine loses its route to the control plane (a refused connection would be kinder)."""

from __future__ import annotations

import socket
import threading

from tests.support.loopback_relay import LoopbackRelay


class PartitionablePath(LoopbackRelay):
    """Forwards 127.0.0.1:``port`` to ``target`` byte for byte (TLS passes through) until
    :meth:`cut`; :meth:`heal` lets new connections through again."""

    def __init__(self, target: str) -> None:
        self._cut = threading.Event()
        super().__init__(target)

    def cut(self) -> None:
        """From now on every byte is dropped, on open connections and new ones alike."""
        self._cut.set()

    def heal(self) -> None:
        """The route is back: the connections open across the cut are reset (as TCP ends
        them once the route returns), and new ones pass."""
        self._close_all()
        self._cut.clear()

    def accepts(self) -> bool:
        return not self._cut.is_set()  # else accepted and never answered: a black hole

    def passes(self, answers: bool) -> bool:
        return not self._cut.is_set()

    def pump_ended(self, source: socket.socket, dest: socket.socket, dropped: bool) -> None:
        """Nothing: a dropped chunk's connection goes nowhere and is not closed (a
        partition says nothing); the sockets are closed by :meth:`heal` or :meth:`close`."""
