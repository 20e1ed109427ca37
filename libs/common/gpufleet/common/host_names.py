"""The names a machine takes on the host it runs on, unique to its deployment and machine.

Slot users, the walls folder and the jobs' cgroup group are host-wide: the kernel knows
one user ``gpufleet-slot-0`` and one ``/var/lib/gpufleet/walls/m0``, whoever made them.
Two agents that picked the same ones wipe each other's slots — the wipe before and after
every job kills every process of its slot's users — and each blames the other's jobs for
dying. So every such name is built here from one *walls name*, a short stable hash of
what makes a machine itself: its deployment, its machine id and where its state lives —
or, for a local machine, its stack's local root (the state folder's ``machines``) and its
machine number (re-used by the next machine of the same stack, so a stack adds no users
without end). Any number of
stacks, test runs and machines then share a host without meeting.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

# Every machine's walls go below this, in a folder of its walls name; every folder above
# must be traversable by others (slot users reach their own folders through it).
WALLS_BASE = Path("/var/lib/gpufleet/walls")
# Room for "gf" + name + "-s" + a slot number within useradd's 32 characters (and the
# agent's own check, users.USER_NAME); lowercase, so it is a valid user name.
WALLS_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
TAG_LENGTH = 10


def stable_tag(*parts: str, length: int = TAG_LENGTH) -> str:
    """A short hex digest of ``parts``: the same on every host and in every process."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:length]


def machine_walls_name(deployment_id: str, machine_id: str, state_dir: Path) -> str:
    """An agent's walls name when none is given: its deployment, machine and state folder."""
    return stable_tag(deployment_id, machine_id, str(state_dir.absolute()))


def local_walls_name(local_root: Path, index: int) -> str:
    """Local machine number ``index`` of the stack whose machines live in ``local_root``
    (the local driver numbers every machine of a root apart, whatever its deployment)."""
    return f"{stack_walls_prefix(local_root)}{index}"


def stack_walls_prefix(local_root: Path) -> str:
    """What the walls name of every local machine of ``local_root`` starts with."""
    return f"{stable_tag(str(local_root.resolve()), length=8)}-m"


@dataclass(frozen=True)
class HostNames:
    """Every host-wide name of one machine, from its walls name."""

    walls_name: str

    def __post_init__(self) -> None:
        if not WALLS_NAME.match(self.walls_name):
            raise ValueError(f"walls name {self.walls_name!r} must match {WALLS_NAME.pattern}")

    @property
    def slot_user_prefix(self) -> str:
        """Slot ``n`` runs as user ``<prefix><n>``."""
        return f"gf{self.walls_name}-s"

    def slot_user(self, slot: int) -> str:
        return f"{self.slot_user_prefix}{slot}"

    @property
    def walls_root(self) -> Path:
        """Slot homes, job folders, run folders and installed pipelines."""
        return WALLS_BASE / self.walls_name

    @property
    def jobs_cgroup(self) -> str:
        """The cgroup its jobs' cgroups go below (in each hierarchy it uses)."""
        return f"gpufleet-jobs-{self.walls_name}"
