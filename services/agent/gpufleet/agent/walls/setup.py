"""Building the walls on this machine, or saying loudly why they cannot be built.

The agent calls :func:`prepare_walls` at start-up: it creates the slot users, finds the
cgroup layout, checks that the walls' folders are reachable by slot users, and runs one
empty sandbox as slot 0's user to prove namespaces, ``no_new_privs`` and the rest work
here. If anything fails, the machine's start-up fails with that reason (Probe reports it,
StartJob refuses every job, and the boot-failure net replaces the machine): a machine that
cannot wall its slots never runs a job unwalled. The runner and the worker rebuild the
same configuration with :func:`walls_config` (the users exist by then).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gpufleet.agent.launcher import CurrentUserLauncher, SlotLauncher
from gpufleet.agent.settings import Settings
from gpufleet.agent.statedir import StateDir
from gpufleet.agent.walls import devices, sandbox
from gpufleet.agent.walls.cgroups import CgroupError, JobCgroup, machine_layout
from gpufleet.agent.walls.launcher import WalledLauncher, WallsConfig, present_system_folders
from gpufleet.agent.walls.users import SlotUserError, ensure_slot_users
from gpufleet.agent.walls.wipe import make_private_folder, remove_tree
from gpufleet.common import host_release
from gpufleet.common.host_names import HostNames, stable_tag

log = logging.getLogger(__name__)

UNWALLED_WARNING = (
    "WALLS ARE OFF (GPUFLEET_WALLS=off): jobs run as the agent's own user, in the machine's "
    "namespaces and network; never use this for more than one tenant"
)


class WallsUnavailable(Exception):
    """This machine cannot build the walls between slots; the message says what failed."""


def unreachable_ancestor(path: Path) -> Path | None:
    """The first folder above (and including) ``path`` that others cannot traverse."""
    current = path.resolve()
    for folder in [*reversed(current.parents), current]:
        try:
            mode = folder.stat().st_mode
        except FileNotFoundError:
            return None  # created later, by root, with a traversable mode
        if not mode & stat.S_IXOTH:
            return folder
    return None


def walls_config(settings: Settings) -> WallsConfig:
    """The walls of this machine as the settings describe them."""
    root = settings.resolved_walls_root
    try:
        users = ensure_slot_users(settings.resolved_slot_user_prefix, settings.slots, root / "homes")
    except (SlotUserError, OSError) as err:
        raise WallsUnavailable(f"slot users: {err}") from err
    try:
        layout = machine_layout(settings.cgroup_parent, settings.host_names.jobs_cgroup)
    except CgroupError as err:
        raise WallsUnavailable(f"cgroups: {err}") from err
    read_only: list[Path] = []
    if settings.clock == "file" and settings.clock_file:
        read_only.append(Path(settings.clock_file).resolve().parent)
    return WallsConfig(
        root=root,
        users=tuple(users),
        cgroups=layout,
        machine_slots=settings.slots,
        slot_python=settings.slot_python,
        bwrap=settings.bwrap_path,
        setpriv=settings.setpriv_path,
        model_gateway_address=settings.model_gateway_address,
        voice_service_address=settings.voice_service_address,
        default_memory_bytes=settings.job_memory_limit_mb << 20,
        default_pids=settings.job_pids_limit,
        read_only=tuple(read_only),
        gpus=tuple(devices.gpu_nodes()),
        attempts=StateDir(settings.agent_state_dir).attempts,
    )


def prepare_walls(settings: Settings) -> WallsConfig:
    """Create and check everything the walls need; WallsUnavailable names what failed."""
    if os.geteuid() != 0:
        raise WallsUnavailable("the agent must run as root to create slot users and cgroups")
    for tool in (settings.bwrap_path, settings.setpriv_path):
        if shutil.which(tool) is None:
            raise WallsUnavailable(f"{tool} is not installed (Debian: apt-get install bubblewrap util-linux)")
    root = settings.resolved_walls_root
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o711)
    blocked = unreachable_ancestor(root)
    if blocked is not None:
        raise WallsUnavailable(f"slot users cannot reach {root}: {blocked} is not traversable by others")
    config = walls_config(settings)
    for path in config.read_only:
        blocked = unreachable_ancestor(path)
        if blocked is not None:
            raise WallsUnavailable(f"slot users cannot read {path}: {blocked} is not traversable by others")
    _probe_cgroup(config)
    _probe_sandbox(config)
    if not config.gpus:
        devices.log_without_gpu(settings.slots)
    log.info(
        "walls ready: %d slot users (%s…), %s, bubblewrap sandboxes under %s",
        len(config.users),
        config.users[0].name,
        config.cgroups.describe(),
        root,
    )
    return config


def _probe_cgroup(config: WallsConfig) -> None:
    probe = JobCgroup(config.cgroups, f"probe-{os.getpid()}")
    try:
        probe.create(64 << 20, 16)
    except CgroupError as err:
        raise WallsUnavailable(str(err)) from err
    finally:
        probe.remove()


def _probe_sandbox(config: WallsConfig) -> None:
    """One empty sandbox as slot 0's user: namespaces, mounts and dropped privileges work."""
    user = config.users[0]
    scratch = config.root / "probe"
    make_private_folder(scratch, 0, 0, 0o711)
    job, run = scratch / "job", scratch / "run"
    make_private_folder(job, user.uid, user.gid)
    make_private_folder(run, 0, user.gid, 0o750)
    plan = sandbox.SandboxPlan(
        uid=user.uid,
        gid=user.gid,
        job_dir=job,
        home=user.home,
        run_dir=run,
        pipeline_dir=run,
        bwrap=config.bwrap,
        setpriv=config.setpriv,
        present=present_system_folders(),
    )
    try:
        done = subprocess.run(
            [*sandbox.bwrap_argv(plan), "/usr/bin/test", "!", "-w", "/usr"],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise WallsUnavailable(f"a trial sandbox did not run: {err}") from err
    finally:
        remove_tree(scratch)
    if done.returncode != 0:
        raise WallsUnavailable(f"a trial sandbox failed ({done.returncode}): {done.stderr.strip()[:300]}")


def build_launcher(settings: Settings) -> SlotLauncher:
    """The launcher a runner or worker uses: walled unless the walls are explicitly off."""
    if settings.walls == "off":
        log.warning(UNWALLED_WARNING)
        return CurrentUserLauncher()
    return WalledLauncher(walls_config(settings))


@contextlib.contextmanager
def scratch_walls(name: str, slots: int) -> Iterator[tuple[Path, WalledLauncher, StateDir]]:
    """Walls in a throwaway folder under /tmp, for a benchmark or a check script run by hand:
    ``(root, launcher, state)``; slot users are ``gf<name>-<hash of root>-s<n>``, so runs
    side by side never share one. The users and the folder are given back at the end."""
    root = Path(tempfile.mkdtemp(prefix=f"gf{name}-", dir="/tmp"))
    root.chmod(0o711)
    names = HostNames(f"{name}-{stable_tag(str(root), length=6)}")
    settings = Settings(
        machine_id=name,
        agent_state_dir=root / "state",
        walls_root=root / "walls",
        walls_name=names.walls_name,
        slots=slots,
    )
    try:
        yield root, WalledLauncher(prepare_walls(settings)), StateDir(settings.agent_state_dir).ensure()
    finally:
        for problem in host_release.release(names):
            log.warning("scratch walls not given back: %s", problem)
        remove_tree(root)
