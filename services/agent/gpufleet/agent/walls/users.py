"""Its own user: one unprivileged system user and group per slot, created idempotently.

A slot's user is never root and never shared between slots, so the kernel's own checks
(file modes, signals, ptrace, ``/proc``) stand between two tenants even before any
namespace does. Users are created with ``useradd``/``groupadd`` from argv lists (never a
shell) and found again by name, so a restarted agent reuses them.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

# useradd accepts at most 32 characters; the prefix must leave room for the slot number.
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,29}$")
NOLOGIN = "/usr/sbin/nologin"


class SlotUserError(Exception):
    """A slot's user cannot be created or is unsafe to use."""


@dataclass(frozen=True)
class SlotUser:
    """The identity one slot's jobs run as."""

    slot: int
    name: str
    uid: int
    gid: int
    home: Path


def slot_user_name(prefix: str, slot: int) -> str:
    name = f"{prefix}{slot}"
    if not USER_NAME.match(name):
        raise SlotUserError(f"slot user name {name!r} is not a valid system user name")
    return name


def ensure_slot_users(prefix: str, slots: int, homes: Path) -> list[SlotUser]:
    """One user and group per slot, created if missing; each home is ``homes/<slot>``."""
    homes.mkdir(parents=True, exist_ok=True)
    homes.chmod(0o711)  # traversable to reach one's own home, not listable
    users = [ensure_slot_user(slot_user_name(prefix, slot), slot, homes / str(slot)) for slot in range(slots)]
    if len({u.uid for u in users}) != len(users):
        raise SlotUserError("two slots resolved to the same uid")
    return users


def ensure_slot_user(name: str, slot: int, home: Path) -> SlotUser:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _run(["groupadd", "--system", "--force", name])
        _run(
            [
                "useradd",
                "--system",
                "--gid",
                name,
                "--no-create-home",
                "--home-dir",
                str(home),
                "--shell",
                NOLOGIN,
                "--comment",
                f"gpufleet slot {slot}",
                name,
            ]
        )
        entry = pwd.getpwnam(name)
    if entry.pw_dir != str(home):  # the walls moved (a re-imaged machine): keep passwd true
        _run(["usermod", "--home", str(home), name])
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise SlotUserError(f"slot user {name!r} is root or in root's group")
    if any(name in g.gr_mem for g in grp.getgrall() if g.gr_gid != entry.pw_gid):
        raise SlotUserError(f"slot user {name!r} belongs to supplementary groups")
    home.mkdir(mode=0o700, exist_ok=True)
    # lchown: a home that was replaced by a symlink must not hand its target to the user.
    os.lchown(home, entry.pw_uid, entry.pw_gid)
    if home.is_symlink() or not home.is_dir():
        raise SlotUserError(f"home of {name!r} is not a plain folder: {home}")
    home.chmod(0o700)
    return SlotUser(slot=slot, name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=home)


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except OSError as err:
        raise SlotUserError(f"{argv[0]} cannot run: {err}") from err
    if done.returncode != 0:
        raise SlotUserError(f"{' '.join(argv[:2])} ... failed: {done.stderr.strip() or done.returncode}")
