"""Where a client command finds the services.

``gpufleet up`` writes the addresses it serves on into its state folder
(``addresses.json``), so a stack started with ``--port-offset`` is reached with the same
``--state-dir`` that already names its operator certificate — no ``--scheduler``,
``--reaper`` or ``--sweeper`` to work out. An address given on the command line wins, then
``GPUFLEET_<SERVICE>_ADDRESS``, then the state folder's, then the default port.

Without it, a command given only ``--reaper`` asked the default scheduler for the system's
time; on a stack with a sped-up clock none answered, and ``gpufleet watchdogs`` counted
the last runs' demo times against this machine's clock ("in 3.4h").
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path

# Each service's gRPC port on a stack with no --port-offset.
DEFAULT_PORTS = {"scheduler": 50051, "reaper": 50052, "provisioner": 50053, "sweeper": 50054}
FILE = "addresses.json"
# The services a client command may be pointed at, each by its own flag (``--reaper``).
CLIENT_SERVICES = ("scheduler", "reaper", "sweeper")


def env_var(service: str) -> str:
    return f"GPUFLEET_{service.upper()}_ADDRESS"


def write(state_dir: Path, addresses: Mapping[str, str]) -> None:
    """Record where the stack on ``state_dir`` serves (replaced whole: a reader never sees
    half a file)."""
    path = state_dir / FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(addresses), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def recorded(state_dir: Path) -> dict[str, str]:
    """What the last ``gpufleet up`` on ``state_dir`` recorded (nothing, or nothing
    readable: the defaults apply)."""
    try:
        data = json.loads((state_dir / FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str) and v}


def resolve(args: argparse.Namespace) -> None:
    """Fill each service address the command takes and was not given (None)."""
    wanted = [s for s in CLIENT_SERVICES if hasattr(args, s) and getattr(args, s) is None]
    if not wanted:
        return
    state_dir = getattr(args, "state_dir", None)
    found = recorded(Path(state_dir)) if state_dir else {}
    for service in wanted:
        address = os.environ.get(env_var(service)) or found.get(service)
        setattr(args, service, address or f"127.0.0.1:{DEFAULT_PORTS[service]}")


def flag_help(service: str) -> str:
    return (
        f"{service} address (host:port; default: ${env_var(service)}, else where the `gpufleet up` "
        f"on --state-dir serves, else 127.0.0.1:{DEFAULT_PORTS[service]})"
    )
