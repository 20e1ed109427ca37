"""Inside a sandbox: offer the egress tunnel as a TCP proxy port, then become the job.

Standalone (standard library only): it runs as the slot's user under the system Python,
which cannot read gpufleet's own installation. ``slot_init.py --listen PORT --to SOCKET --
ARGV...`` binds ``127.0.0.1:PORT`` in the job's own network namespace, leaves a child that
forwards each connection to the Unix socket ``SOCKET`` (the runner's egress proxy, outside),
and execs ``ARGV``. The child lives in the job's PID namespace and ends with it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until ``src`` closes, then close ``dst`` for writing (shared
    with the runner's tunnels, which import it: this file must stay standard-library only)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _forward(conn: socket.socket, target: str) -> None:
    with conn, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
        try:
            upstream.connect(target)
        except OSError:
            return
        back = threading.Thread(target=pump, args=(upstream, conn), daemon=True)
        back.start()
        pump(conn, upstream)
        back.join()


def _serve(listener: socket.socket, target: str) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_forward, args=(conn, target), daemon=True).start()


def main(argv: list[str]) -> int:
    if len(argv) < 6 or argv[0] != "--listen" or argv[2] != "--to" or argv[4] != "--":
        print("usage: slot_init.py --listen PORT --to SOCKET -- ARGV...", file=sys.stderr)
        return 2
    port, target, command = int(argv[1]), argv[3], argv[5:]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    if os.fork() == 0:
        os.setsid()
        _serve(listener, target)
        os._exit(0)
    listener.close()
    os.execvp(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
