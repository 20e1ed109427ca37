"""EC2 clients for the aws driver: one per region, bounded, from the standard credential chain.

Credentials are never a setting: the boto3 session resolves them the standard way
(environment, shared config/credentials files, SSO, container or instance role). The
only endpoint knob is ``endpoint_url``, for an emulator (moto's server in tests).

Every client has bounded retries (botocore's "standard" mode: throttling, 5xx and
connection errors, with jittered back-off) and bounded connect/read timeouts, so no
provider call can hang a provisioner thread.

Tests pass ``on_client`` to register botocore event hooks on each client as it is built
(``before-call.ec2.RunInstances`` ...): errors are injected through the SDK's own event
system, never by patching.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config

__all__ = ["ClientBounds", "Ec2ClientFactory", "Ec2Clients"]

Ec2ClientFactory = Callable[[str], Any]
"""Region name -> EC2 client (boto3 has no type stubs here, hence Any)."""


@dataclass(frozen=True)
class ClientBounds:
    """How long and how often one provider call may try."""

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    # Total attempts per call, the first included (botocore "standard" retry mode).
    max_attempts: int = 3

    def config(self) -> Config:
        return Config(
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"mode": "standard", "total_max_attempts": self.max_attempts},
        )


class Ec2Clients:
    """Builds one EC2 client per region on first use and keeps it (thread-safe; boto3
    clients are safe to share between threads, sessions are not, hence the lock)."""

    def __init__(
        self,
        session: boto3.Session | None = None,
        *,
        endpoint_url: str | None = None,
        bounds: ClientBounds | None = None,
        on_client: Callable[[str, Any], None] | None = None,
    ) -> None:
        self._session = session if session is not None else boto3.Session()
        self._endpoint_url = endpoint_url or None
        self._config = (bounds or ClientBounds()).config()
        self._on_client = on_client
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, region: str) -> Any:
        with self._lock:
            client = self._clients.get(region)
            if client is None:
                client = self._session.client(
                    "ec2", region_name=region, endpoint_url=self._endpoint_url, config=self._config
                )
                if self._on_client is not None:
                    self._on_client(region, client)
                self._clients[region] = client
            return client
