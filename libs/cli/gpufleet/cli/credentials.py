"""Which certificate a CLI command calls with.

In a deployment the environment names it (``GPUFLEET_TLS_CA_FILE``, ``..._CERT_FILE``,
``..._KEY_FILE``, ``GPUFLEET_DEPLOYMENT_ID``), as for every gpufleet process. Otherwise
it is the operator certificate ``gpufleet up`` made in its state dir (``--state-dir``,
the same default as ``up``), so a newcomer's commands work with no flag at all. That
certificate is short-lived (30 days) and renewed in place by the first command that finds
it nearing its expiry (``gpufleet up`` renews it too, at each start).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import grpc

from gpufleet.common import grpcclient
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority
from gpufleet.common.trust.transport import Transport, TransportNotConfigured

DEFAULT_STATE_DIR = "var"
OPERATOR = "operator"

log = logging.getLogger(__name__)


def tls_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / "tls"


def transport_for(state_dir: str | Path) -> Transport:
    env = os.environ
    if any(env.get(k) for k in ("GPUFLEET_TLS_CA_FILE", "GPUFLEET_TLS_CERT_FILE", "GPUFLEET_TLS_KEY_FILE")):
        return Transport.from_paths(
            env.get("GPUFLEET_DEPLOYMENT_ID", "local"),
            env.get("GPUFLEET_TLS_CA_FILE"),
            env.get("GPUFLEET_TLS_CERT_FILE"),
            env.get("GPUFLEET_TLS_KEY_FILE"),
            False,
            "gpufleet",
        )
    folder = tls_dir(state_dir)
    try:
        authority = Authority.open(folder)
    except FileNotFoundError:
        if env.get("GPUFLEET_INSECURE", "").lower() in ("1", "true", "yes"):
            return Transport(env.get("GPUFLEET_DEPLOYMENT_ID", "local"), None)
        raise TransportNotConfigured(
            f"no operator certificate in {folder}: start the system with `gpufleet up --state-dir "
            f"{state_dir}` (it makes one), pass --state-dir, or set GPUFLEET_TLS_CA_FILE, "
            "GPUFLEET_TLS_CERT_FILE and GPUFLEET_TLS_KEY_FILE"
        ) from None
    files = authority.files(OPERATOR)
    try:
        authority.ensure_part(Identity(Role.OPERATOR, authority.deployment), OPERATOR)
    except OSError as exc:  # a state dir this user may read but not write: use what is there
        log.warning("could not renew the operator certificate in %s: %s", folder, exc)
    if not files.cert.exists():
        raise TransportNotConfigured(f"{folder} has a CA but no operator certificate ({files.cert})")
    return Transport(authority.deployment, files)


def channel(args: argparse.Namespace, address: str, server: Role) -> grpc.Channel:
    """A channel to the part ``server`` at ``address`` with this command's certificate."""
    try:
        transport = transport_for(getattr(args, "state_dir", None) or DEFAULT_STATE_DIR)
    except TransportNotConfigured as exc:
        raise SystemExit(f"gpufleet: {exc}") from None
    return grpcclient.open_channel(address, transport, server)
