"""A real HTTP server on 127.0.0.1 that takes webhook posts, for the incident webhook's tests:
it keeps every JSON body it answered 200, can fail the next posts with a 503, and can hold a
post until the test lets it through."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Receiver:
    url: str
    # Bodies answered 200, in the order they arrived.
    received: list[dict[str, Any]] = field(default_factory=list)
    # Every POST that reached the server, answered or not.
    requests: int = 0
    # The next this many posts are answered 503.
    fail_next: int = 0
    # While cleared, a post waits before it is answered (``arrived`` says one is waiting).
    let_through: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def wait_for(self, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The bodies received once there are ``n`` (fails the test after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self.lock:
                if len(self.received) >= n:
                    return list(self.received)
            assert time.monotonic() < deadline, f"{len(self.received)} of {n} posts arrived"
            time.sleep(0.01)


@contextmanager
def serve_receiver() -> Iterator[Receiver]:
    receiver = Receiver(url="")
    receiver.let_through.set()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.requests += 1
                fail = receiver.fail_next > 0
                if fail:
                    receiver.fail_next -= 1
            receiver.arrived.set()
            receiver.let_through.wait(30)
            if fail:
                self.send_response(503)
                self.end_headers()
                return
            assert self.headers.get("Content-Type") == "application/json"
            with receiver.lock:
                receiver.received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.let_through.set()
        server.shutdown()
        server.server_close()


def nowhere_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (a receiver that is down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"
