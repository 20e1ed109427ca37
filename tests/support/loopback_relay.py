"""A loopback TCP relay a test can break: the one skeleton under the tests' faulty paths
(a partition that holds every byte, a connection that loses one answer).

It forwards 127.0.0.1:``port`` to ``target`` byte for byte, so TLS passes through
untouched and both ends see a real network path; a subclass decides, per connection and per
chunk, what a fault does to it."""

from __future__ import annotations

import contextlib
import socket
import threading


class LoopbackRelay:
    """Listens on a free loopback port at once; :meth:`close` ends it and every connection."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._listener.close()
        self._close_all()

    def _close_all(self) -> None:
        with self._lock:
            stale, self._sockets = self._sockets, []
        for sock in stale:
            with contextlib.suppress(OSError):
                sock.close()

    def _held(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def accepts(self) -> bool:
        """Whether a new connection reaches the target (False: accepted, never answered)."""
        return True

    def passes(self, answers: bool) -> bool:
        """Whether the next chunk goes on (``answers``: it comes from the target). False
        drops it and ends this direction's pump; :meth:`pump_ended` says what follows."""
        return True

    def pump_ended(self, source: socket.socket, dest: socket.socket, dropped: bool) -> None:
        """Both ends shut when a direction ends (the peer closed, or a chunk was dropped)."""
        for sock in (source, dest):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._held(client)
            if not self.accepts():
                continue
            server = socket.create_connection(self.target)
            self._held(server)
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, dest: socket.socket, answers: bool) -> None:
        dropped = False
        try:
            while data := source.recv(65536):
                if not self.passes(answers):
                    dropped = True
                    break
                dest.sendall(data)
        except OSError:
            pass
        self.pump_ended(source, dest, dropped)
