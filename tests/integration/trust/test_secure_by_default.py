"""A service with no TLS settings does not start; the insecure development mode is asked
for by name, and then every log line says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.procs import start_service


def bare_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}


def test_a_service_without_tls_refuses_to_start_and_says_what_to_set(tmp_path: Path) -> None:
    for service in ("provisioner", "scheduler", "reaper", "sweeper"):
        out = subprocess.run(
            [sys.executable, "-m", f"gpufleet.{service}"],
            env={
                **bare_env(),
                "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
                "GPUFLEET_DATABASE_URL": "sqlite://",
            },
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 2, (service, out.stderr[-2000:])
        assert "GPUFLEET_TLS_CA_FILE" in out.stderr and "GPUFLEET_INSECURE" in out.stderr, service


def test_half_a_tls_configuration_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpufleet.provisioner"],
        env={**bare_env(), "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0", "GPUFLEET_TLS_CA_FILE": "/etc/hostname"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "must be set together" in out.stderr


def test_the_insecure_development_mode_says_so_on_every_line(tmp_path: Path) -> None:
    svc = start_service("provisioner", tmp_path, {"GPUFLEET_INSECURE": "true", "GPUFLEET_DRIVERS": "sim"})
    try:
        with grpc.insecure_channel(svc.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        svc.stop()
    lines = [json.loads(line) for line in svc.log().splitlines() if line.startswith("{")]
    assert lines and all(line.get("insecure") is True for line in lines)
    assert any("INSECURE" in line["message"] for line in lines)
