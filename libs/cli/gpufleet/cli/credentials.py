"""Which certificate a CLI command calls with.

In a deployment the environment names it (``GPUFLEET_TLS_CA_FILE``, ``..._CERT_FILE``,
``..._KEY_FILE``, ``GPUFLEET_DEPLOYMENT_ID``), as for every gpufleet process. Otherwise
it is the operator certificate ``gpufleet up`` made in its state dir (``--state-dir``,
the same default as ``up``), so a newcomer's commands work with no flag at all.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import grpc

from gpufleet.common import grpcclient
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.pki import Authority
from gpufleet.common.trust.transport import Transport, TransportNotConfigured

DEFAULT_STATE_DIR = "var"
OPERATOR = "operator"


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
