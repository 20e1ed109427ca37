"""Its own processes, mounts and temporary files: the bubblewrap command line of one job.

Why bubblewrap rather than ``unshare`` + ``setpriv``: ``unshare`` makes namespaces but
builds no file system view, so the mounts (a fresh root, read-only system folders, private
``/tmp``) would need a helper run as root inside the new namespaces. bubblewrap builds the
view, drops every capability, sets ``no_new_privs``, can forbid nested user namespaces
(``--disable-userns``) and dies with its parent, in one small audited binary that Debian
ships. It is run *unprivileged*, already as the slot's user (``setpriv`` drops root first):
its user namespace maps that uid to itself, so the job's files on the host belong to the
slot user and to nobody else, and nothing it does is done as root.

:func:`bwrap_argv` is pure — a plan in, an argv list out — so every wall it builds is read
and tested without starting a process. No tenant value ever appears in it: tenant values
travel in the spec file the job reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Where things appear inside the sandbox.
JOB_DIR = Path("/job")
HOME_DIR = Path("/home/slot")
RUN_DIR = Path("/run/gpufleet")
PIPELINE_DIR = Path("/opt/gpufleet/pipeline")
HOSTNAME = "slot"

# System folders the pipeline needs, read-only; usr-merged distributions make some links.
SYSTEM_FOLDERS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class SandboxPlan:
    """Everything that decides one job's walls."""

    uid: int
    gid: int
    job_dir: Path  # host folder, 0700, owned by the slot user
    home: Path  # host folder, 0700, owned by the slot user (wiped before and after)
    run_dir: Path  # host folder with spec.json and the tunnels' sockets (read-only inside)
    pipeline_dir: Path  # host folder of the pipeline version this job started with
    devices: tuple[str, ...] = ()  # device nodes the slot may use (its GPU)
    # Extra host paths to show read-only at the same place (the clock file's folder).
    read_only: tuple[Path, ...] = ()
    system_folders: tuple[str, ...] = SYSTEM_FOLDERS
    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    present: frozenset[str] = field(default_factory=frozenset)  # which system folders exist


def bwrap_argv(plan: SandboxPlan) -> list[str]:
    """The argv prefix that runs what follows it behind the slot's walls."""
    argv = [
        plan.setpriv,
        f"--reuid={plan.uid}",
        f"--regid={plan.gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
        plan.bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",  # only loopback; tunnels are the ways out
        "--unshare-cgroup-try",
        "--disable-userns",  # no nested user namespace: no `unshare -Ur` back to caps
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into a terminal outside
        "--cap-drop",
        "ALL",
        "--hostname",
        HOSTNAME,
    ]
    for folder in plan.system_folders:
        if folder in plan.present:
            argv += ["--ro-bind", folder, folder]
    argv += [
        "--proc",
        "/proc",  # a new procfs: only this job's PID namespace
        "--dev",
        "/dev",  # a minimal /dev: null, zero, random, tty, pts — no host device
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/var/tmp",
        "--tmpfs",
        "/dev/shm",
        "--tmpfs",
        "/run",
    ]
    for node in plan.devices:
        argv += ["--dev-bind", node, node]
    argv += ["--bind", str(plan.job_dir), str(JOB_DIR)]
    argv += ["--bind", str(plan.home), str(HOME_DIR)]
    argv += ["--ro-bind", str(plan.run_dir), str(RUN_DIR)]
    argv += ["--ro-bind", str(plan.pipeline_dir), str(PIPELINE_DIR)]
    for path in plan.read_only:
        argv += ["--ro-bind", str(path), str(path)]
    argv += ["--chdir", str(JOB_DIR), "--"]
    return argv
