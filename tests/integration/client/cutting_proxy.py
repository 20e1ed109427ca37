"""A loopback TCP proxy that can lose one answer: the connection a call went out on is cut
as the server starts answering, so the client sees UNAVAILABLE for a call the server may
well have done — the case an idempotency key is for."""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttingProxy:
    """Forwards 127.0.0.1:``port`` to the server at ``target``, byte for byte (TLS passes
    through untouched). After :meth:`cut_next_answer`, the first bytes the server sends are
    dropped and both sides of that connection are closed."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.connections = 0
        self.cuts = 0
        self._armed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut_next_answer(self) -> None:
        self._armed.set()

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
            server = socket.create_connection(self.target)
            with self._lock:
                self.connections += 1
                self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, dest: socket.socket, answers: bool) -> None:
        try:
            while data := source.recv(65536):
                if answers and self._armed.is_set():
                    self._armed.clear()
                    with self._lock:
                        self.cuts += 1
                    break
                dest.sendall(data)
        except OSError:
            pass
        for sock in (source, dest):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()
