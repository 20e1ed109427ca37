"""A stand-in for ``python -m gpufleet.agent`` that speaks the local driver's contract.

It reads the environment the driver gives an agent, starts a "worker" child in its own
process group (as the real agent does), binds GPUFLEET_LISTEN_ADDRESS, and writes
``agent.port`` and ``agent.pid`` into GPUFLEET_AGENT_STATE_DIR once it serves. Each
connection is answered with the machine id, so a test can tell which agent it reached.

Modes (argv[1]): ``serve`` (default); ``hang`` (never reports its port: a hung boot);
``ignore-term`` (agent and worker ignore SIGTERM, so only SIGKILL ends them).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "serve"
    state = Path(os.environ["GPUFLEET_AGENT_STATE_DIR"])
    machine_id = os.environ["GPUFLEET_MACHINE_ID"]
    host, port = os.environ["GPUFLEET_LISTEN_ADDRESS"].rsplit(":", 1)
    _write(
        state / "agent.env.json",
        json.dumps({k: v for k, v in os.environ.items() if k.startswith("GPUFLEET_")}),
    )
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the worker
    worker = subprocess.Popen(
        [sys.executable, "-c", "import threading; threading.Event().wait()"], stdin=subprocess.DEVNULL
    )
    _write(state / "worker.pid", str(worker.pid))
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, int(port)))
    server.listen()
    if mode != "hang":
        _write(state / "agent.pid", str(os.getpid()))
        _write(state / "agent.port", str(server.getsockname()[1]))
    while True:
        conn, _ = server.accept()
        with conn:
            conn.sendall(machine_id.encode() + b"\n")


if __name__ == "__main__":
    main()
