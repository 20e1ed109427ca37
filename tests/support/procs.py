"""Start gpufleet services as real processes for integration and end-to-end tests.

Each binds port 0 and announces its port through GPUFLEET_PORT_FILE; the helper waits
for the port and for the standard gRPC health check to say SERVING.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)


def wait_healthy(address: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                if resp.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError as exc:
                last = exc
            time.sleep(0.05)
    raise TimeoutError(f"{address} not healthy after {timeout}s: {last}")


def start_service(
    name: str, workdir: Path, env: dict[str, str], *, port: int = 0, timeout: float = 30.0, tag: str = ""
) -> ServiceProcess:
    """``python -m gpufleet.<name>`` with ``env`` on top of this process's environment."""
    workdir.mkdir(parents=True, exist_ok=True)
    label = f"{name}{tag}"
    port_file = workdir / f"{label}.port"
    port_file.unlink(missing_ok=True)
    log_path = workdir / f"{label}.log"
    full_env = {
        **os.environ,
        **env,
        "GPUFLEET_LISTEN_ADDRESS": f"127.0.0.1:{port}",
        "GPUFLEET_PORT_FILE": str(port_file),
        "GPUFLEET_LOG_FORMAT": "json",
    }
    log_fh = open(log_path, "ab")  # noqa: SIM115 - the child keeps writing to it
    proc = subprocess.Popen(
        [sys.executable, "-m", f"gpufleet.{name}"],
        env=full_env,
        cwd=workdir,
        stdout=log_fh,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log_fh.close()
    deadline = time.monotonic() + timeout
    while not port_file.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{label} exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{label} did not announce its port:\n{log_path.read_text()[-4000:]}")
        time.sleep(0.05)
    bound = int(port_file.read_text())
    svc = ServiceProcess(name=name, process=proc, port=bound, log_path=log_path, env=env)
    wait_healthy(svc.address, timeout=max(1.0, deadline - time.monotonic()))
    return svc
