"""The seam where the walls between tenants go (DESIGN §10).

A runner never starts a job directly: it asks a :class:`SlotLauncher` to open the slot,
to build the argv prefix that puts the job behind the slot's walls, and to close the slot
when the job ends. Today's :class:`CurrentUserLauncher` builds no walls — the job runs as
the agent's own user — so that the isolation issue can replace exactly one object (its
prefix will be ``unshare``/``setpriv`` or ``bwrap`` with the slot's user, namespaces and
cgroup) without touching how jobs are run, timed or reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from gpufleet.agent.specs import JobSpec


class SlotError(Exception):
    """The slot could not be opened or closed: the job must not run, and is not charged."""


class SlotLauncher(Protocol):
    """Puts one job behind its slot's walls."""

    name: str

    def open_slot(self, spec: JobSpec) -> None:
        """Prepare the slot (user, folders, cgroup, network); raise SlotError if it cannot
        be closed off — the runner then reports INFRA_ERROR without starting the job."""
        ...

    def argv_prefix(self, spec: JobSpec) -> list[str]:
        """The argv that runs what follows it inside the slot (empty: no walls)."""
        ...

    def job_environment(self, spec: JobSpec, base: Mapping[str, str]) -> dict[str, str]:
        """The job's environment, built from ``base`` (what the runner chose to pass on)."""
        ...

    def close_slot(self, spec: JobSpec) -> None:
        """Wipe the slot after the job, whatever happened (idempotent)."""
        ...


class CurrentUserLauncher:
    """No walls yet: the job runs as the agent's user, in the machine's process group."""

    name = "current-user"

    def open_slot(self, spec: JobSpec) -> None:
        return None

    def argv_prefix(self, spec: JobSpec) -> list[str]:
        return []

    def job_environment(self, spec: JobSpec, base: Mapping[str, str]) -> dict[str, str]:
        return dict(base)

    def close_slot(self, spec: JobSpec) -> None:
        return None
