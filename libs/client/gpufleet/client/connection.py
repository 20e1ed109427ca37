"""What a client is opened with: the scheduler's address, its credentials and channel
options, and the deadlines each kind of call gets unless told otherwise. Shared by the sync
and the asyncio client, which differ only in the channel they build from it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import grpc

from gpufleet.client.certificates import CertificateFolder
from gpufleet.client.service_config import channel_options

# A unary call's deadline when the caller names none.
DEFAULT_TIMEOUT_S = 10.0
# Each WatchJob stream's deadline: the watch reopens it when it runs out, so a connection
# that went silent without closing is noticed at the latest then.
DEFAULT_WATCH_STREAM_TIMEOUT_S = 300.0
# How long a watch keeps trying to reach the scheduler again after losing its stream.
DEFAULT_WATCH_RECONNECT_WITHIN_S = 60.0


@dataclass(frozen=True)
class Deadlines:
    """Seconds; every call has one, the caller may name its own per call."""

    call: float = DEFAULT_TIMEOUT_S
    watch_stream: float = DEFAULT_WATCH_STREAM_TIMEOUT_S
    watch_reconnect_within: float = DEFAULT_WATCH_RECONNECT_WITHIN_S


@dataclass(frozen=True)
class Connection:
    address: str
    # None: plaintext, for a development stack run with GPUFLEET_INSECURE only.
    credentials: grpc.ChannelCredentials | None
    options: list[tuple[str, Any]]

    @classmethod
    def of(
        cls,
        address: str,
        certs: str | os.PathLike[str] | None,
        *,
        deployment: str | None,
        insecure: bool,
        options: list[tuple[str, Any]] | None = None,
    ) -> Connection:
        """Mutual TLS from the certificate folder ``certs``; plaintext only when asked by
        name (``insecure=True`` and no folder), never as a fallback."""
        extra = list(options or [])
        if certs is not None and insecure:
            raise ValueError("a certificate folder or insecure=True, not both")
        if certs is None:
            if not insecure:
                raise ValueError(
                    "no certificate folder: pass the folder `gpufleet certs issue --role backend --out DIR` "
                    "wrote, or insecure=True for a development stack run without TLS"
                )
            return cls(address, None, channel_options(None) + extra)
        folder = CertificateFolder.read(certs, deployment)
        return cls(address, folder.channel_credentials(), channel_options(folder.server_name) + extra)
