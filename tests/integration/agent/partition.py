"""A loopback TCP path that can be cut like a network partition: once cut, nothing passes
either way and nothing is refused — calls hang until their deadline, as they do when a
machine loses its route to the control plane (a refused connection would be kinder)."""

from __future__ import annotations

import contextlib
import socket
import threading


class PartitionablePath:
    """Forwards 127.0.0.1:``port`` to ``target`` byte for byte (TLS passes through) until
    :meth:`cut`; :meth:`heal` lets new connections through again."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """From now on every byte is dropped, on open connections and new ones alike."""
        self._cut.set()

    def heal(self) -> None:
        """The route is back: the connections open across the cut are reset (as TCP ends
        them once the route returns), and new ones pass."""
        with self._lock:
            stale, self._sockets = self._sockets, []
        for sock in stale:
            with contextlib.suppress(OSError):
                sock.close()
        self._cut.clear()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._sockets.append(client)
            if self._cut.is_set():
                continue  # accepted and never answered: a black hole
            server = socket.create_connection(self.target)
            with self._lock:
                self._sockets.append(server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, source: socket.socket, dest: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if self._cut.is_set():
                    return  # the bytes, and the connection, go nowhere (nor are closed)
                dest.sendall(data)
