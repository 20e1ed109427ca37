"""Container HEALTHCHECK for every gpufleet service image.

Asks the service's own standard gRPC health service (``grpc.health.v1.Health/Check``) on its
plaintext health-only port (``GPUFLEET_HEALTH_LISTEN_ADDRESS``: the main port serves mutual
TLS only, and a probe holds no certificate; a wildcard host is probed on loopback) and exits 0
only for SERVING. A development server run with ``GPUFLEET_INSECURE`` and no health port is
probed on ``GPUFLEET_LISTEN_ADDRESS``. Usage: ``python grpc_health_probe.py [SERVICE_NAME]`` (default: the
whole server, ``""``).
"""

from __future__ import annotations

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

TIMEOUT_S = 3.0


def probe_target(listen_address: str) -> str:
    """The address to dial for a server that listens on ``listen_address``."""
    host, sep, port = listen_address.rpartition(":")
    if not sep or not port.isdigit() or port == "0":
        raise ValueError(f"the health listen address {listen_address!r} names no fixed port")
    if host in ("", "0.0.0.0", "[::]", "::", "*"):
        host = "127.0.0.1"
    return f"{host}:{port}"


def check(target: str, service: str = "") -> str:
    """The serving status name the server reports for ``service``."""
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT_S)
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def main(argv: list[str]) -> int:
    service = argv[1] if len(argv) > 1 else ""
    try:
        address = os.environ.get("GPUFLEET_HEALTH_LISTEN_ADDRESS") or os.environ.get(
            "GPUFLEET_LISTEN_ADDRESS", ""
        )
        target = probe_target(address)
        status = check(target, service)
    except ValueError as err:
        print(f"health probe: {err}", file=sys.stderr)
        return 2
    except grpc.RpcError as err:
        print(f"health probe: {target}: {err.code().name}", file=sys.stderr)
        return 1
    print(f"health probe: {target} {service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
