"""What a client is opened with: the scheduler's address, its certificate folder (followed
as it changes) and channel options, and the deadlines each kind of call gets unless told
otherwise. Shared by the sync and the asyncio client, which differ only in the channels they
build from it (:mod:`.channels`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from gpufleet.client.certificates import CHECK_EVERY_S, CertificateWatch
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
    certificates: CertificateWatch | None
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
        certs_check_interval: float = CHECK_EVERY_S,
    ) -> Connection:
        """Mutual TLS from the certificate folder ``certs``, looked at again at most every
        ``certs_check_interval`` seconds; plaintext only when asked by name
        (``insecure=True`` and no folder), never as a fallback."""
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
        watch = CertificateWatch(certs, deployment, check_every_s=certs_check_interval)
        return cls(address, watch, channel_options(watch.current().server_name) + extra)
