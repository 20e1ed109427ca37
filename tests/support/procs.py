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

from gpufleet.common.trust.identity import Role
from tests.support import tls


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

    @property
    def role(self) -> Role:
        return role_of(self.name)

    @property
    def deployment(self) -> str:
        return self.env.get("GPUFLEET_DEPLOYMENT_ID", tls.DEFAULT_DEPLOYMENT)

    def channel(self, who: str | Role = Role.OPERATOR, **options: object) -> grpc.Channel:
        """A channel to this service, calling as ``who`` (an operator unless told)."""
        return tls.channel(
            self.address,
            self.role,
            who=who,
            deployment=self.deployment,
            options=list(options.items()) or None,
            machine_id=self.env.get("GPUFLEET_MACHINE_ID") if self.role is Role.MACHINE else None,
        )

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


def role_of(name: str) -> Role:
    return Role.MACHINE if name == "agent" else Role(name)


def identity_env(name: str, env: dict[str, str]) -> dict[str, str]:
    """The certificate that makes this process ``name`` (unless the test set its own, or
    runs it insecure on purpose)."""
    if any(k.startswith("GPUFLEET_TLS_") for k in env) or env.get("GPUFLEET_INSECURE"):
        return {}
    deployment = env.get("GPUFLEET_DEPLOYMENT_ID", tls.DEFAULT_DEPLOYMENT)
    who = f"machine:{env['GPUFLEET_MACHINE_ID']}" if name == "agent" else name
    return tls.env(who, deployment)


def health_channel(address: str, name: str, env: dict[str, str]) -> grpc.Channel:
    if env.get("GPUFLEET_INSECURE"):
        return grpc.insecure_channel(address)
    deployment = env.get("GPUFLEET_DEPLOYMENT_ID", tls.DEFAULT_DEPLOYMENT)
    machine_id = env.get("GPUFLEET_MACHINE_ID") if name == "agent" else None
    return tls.channel(address, role_of(name), deployment=deployment, machine_id=machine_id)


def wait_healthy(address: str, timeout: float = 30.0, channel: grpc.Channel | None = None) -> None:
    """Until the standard health check says SERVING (over ``channel``: an operator's TLS
    channel to the service, from :func:`health_channel`)."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    with channel if channel is not None else grpc.insecure_channel(address) as channel:
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
    env = {**env, **identity_env(name, env)}
    full_env = {
        **os.environ,
        # Its metrics listener on a port of its own (a benchmark starts it outside pytest).
        "GPUFLEET_METRICS_ADDRESS": os.environ.get("GPUFLEET_METRICS_ADDRESS", "127.0.0.1:0"),
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
    wait_healthy(
        svc.address,
        timeout=max(1.0, deadline - time.monotonic()),
        channel=health_channel(svc.address, name, env),
    )
    return svc
