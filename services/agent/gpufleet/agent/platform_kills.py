"""Kills the platform makes, written down before they are made.

A job that dies of a signal may have sent it to itself (``kill -9 $$``), been killed by
the kernel at its memory limit — both its own doing, charged and counted against its
retry budget — or been killed by the platform: a slot's wipe, the machine stopping, a
lost runner's clean-up. Linux does not tell a parent who sent the signal, and an exit
code of 137 reads the same either way. So every part of the machine that kills processes
an attempt may still be running first writes down why, where that attempt's runner looks
when its job ends:

- ``attempts/<attempt>/platform_kill`` — one attempt's processes (the wipe of a slot that
  a live attempt still holds);
- ``machine.stopping`` in the state directory — every attempt's (the machine is being
  stopped or destroyed; written by whoever stops it, cleared when it starts again).

The runner's own kills (a cancel, the time limit, its own stop) need no record: it knows
why it sent them. No record and no kill of its own: the job's death is the job's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import ATTEMPT_ID_PATTERN, AttemptFiles, atomic_write_text

log = logging.getLogger(__name__)

ATTEMPT_RECORD = "platform_kill"
# The provisioner's local driver writes the same name (it may not import the agent).
MACHINE_RECORD = "machine.stopping"


def record_attempt_kill(files: AttemptFiles, why: str) -> None:
    """Before killing processes of ``files``' attempt: say the platform is killing them."""
    if files.result.exists():
        return  # its verdict is written: nothing is left to attribute
    atomic_write_text(files.folder / ATTEMPT_RECORD, f"{why}\n")
    log.warning("attempt %s: killed by the platform: %s", files.attempt_id, why)


def record_machine_stop(state_root: Path, why: str) -> None:
    """Before stopping every process of the machine (its state directory ``state_root``)."""
    atomic_write_text(state_root / MACHINE_RECORD, f"{why}\n")


def clear_machine_stop(state_root: Path) -> None:
    """The machine runs again: its jobs' deaths are theirs until it is stopped again."""
    (state_root / MACHINE_RECORD).unlink(missing_ok=True)


def recorded_kill(files: AttemptFiles) -> str:
    """Why the platform killed this attempt's job, or "" when it did not say it would."""
    state_root = files.folder.parent.parent  # <state>/attempts/<attempt>
    for path in (files.folder / ATTEMPT_RECORD, state_root / MACHINE_RECORD):
        try:
            why = path.read_text().strip()
        except FileNotFoundError:
            continue
        return why or "killed by the platform"
    return ""


def live_attempts_on_slot(attempts: Path, slot: int, sparing: str = "") -> Iterator[AttemptFiles]:
    """Attempts in ``attempts`` without a verdict whose job runs as ``slot``'s user (a
    film runs as its first slot's), other than ``sparing``."""
    try:
        folders = sorted(attempts.iterdir())
    except FileNotFoundError:
        return
    for folder in folders:
        if folder.name == sparing or not ATTEMPT_ID_PATTERN.match(folder.name):
            continue
        files = AttemptFiles(folder)
        if files.result.exists():
            continue
        try:
            if JobSpec.load(files.spec).slot == slot:
                yield files
        except (FileNotFoundError, KeyError, TypeError, ValueError):
            continue  # a folder being made or set aside: no job of its runs yet
