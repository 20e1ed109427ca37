"""The walled launcher: every wall of seed 001 "Keeping tenants apart" around one job.

Opening a slot, in order (any failure is a :class:`SlotError`: the job does not run):

1. wipe first — the slot user's processes, SysV IPC objects, files in the shared
   temporary folders and home are removed, whatever the last job left (an attempt that
   still runs there is told first that the platform kills it: :mod:`gpufleet.agent.platform_kills`);
2. the job's cgroup, with its kind's memory and pids limits;
3. its folder ``<root>/jobs/<attempt>`` (``0700``, the slot user's; ``jobs/`` is ``0711``
   root's, so no slot can list it) and its read-only run folder with the spec, the
   in-sandbox forwarder and the tunnels' sockets;
4. the tunnels (model gateway, voice service; the egress proxy for a kind that runs only
   the platform's code).

The job then starts as the slot user under bubblewrap (:mod:`.sandbox`) with an
environment built from scratch — no variable of the agent's, so no platform or cloud
credential — and joins its cgroup between fork and exec. Closing kills the cgroup whole,
then wipes everything again and removes the folders.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent import platform_kills
from gpufleet.agent.launcher import OpenSlot, SlotError, expand_pipeline_command
from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import AttemptFiles
from gpufleet.agent.walls import devices, network, sandbox, wipe
from gpufleet.agent.walls.cgroups import CgroupError, CgroupLayout, JobCgroup
from gpufleet.agent.walls.users import SlotUser

log = logging.getLogger(__name__)

SHARED_TEMP = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
SLOT_INIT = Path(__file__).with_name("slot_init.py")
# What a job's environment may carry over from the runner's: the shared clock only.
CLOCK_VARIABLES = ("GPUFLEET_CLOCK", "GPUFLEET_CLOCK_SPEED", "GPUFLEET_CLOCK_ORIGIN", "GPUFLEET_CLOCK_FILE")


@dataclass(frozen=True)
class WallsConfig:
    """What the walled launcher is built from (the agent's settings, resolved)."""

    root: Path
    users: tuple[SlotUser, ...]
    cgroups: CgroupLayout
    machine_slots: int
    slot_python: str = "/usr/bin/python3"
    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    model_gateway_address: str = ""
    voice_service_address: str = ""
    default_memory_bytes: int = 8 << 30
    default_pids: int = 1024
    # Host folders shown read-only at the same path (the clock file's folder in tests).
    read_only: tuple[Path, ...] = ()
    gpus: tuple[int, ...] = ()
    # The machine's attempt folders (statedir), where a wipe records whom it kills.
    attempts: Path | None = None

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def runs(self) -> Path:
        return self.root / "run"

    def job_dir(self, attempt_id: str) -> Path:
        return self.jobs / attempt_id

    def run_dir(self, attempt_id: str) -> Path:
        return self.runs / attempt_id

    def user(self, slot: int) -> SlotUser:
        return self.users[slot]


def present_system_folders() -> frozenset[str]:
    return frozenset(f for f in sandbox.SYSTEM_FOLDERS if os.path.exists(f))


class WalledSlot:
    """One open, walled slot (see the module docstring)."""

    def __init__(self, config: WallsConfig, spec: JobSpec, pipeline_dir: Path) -> None:
        self.config = config
        self.spec = spec
        self.user = config.user(spec.slot)
        self.cgroup = JobCgroup(config.cgroups, spec.attempt_id)
        self.tunnels: list[network.UnixListener] = []
        self.egress = spec.outbound_network
        self.pipeline_dir = pipeline_dir
        self.run_dir = config.run_dir(spec.attempt_id)
        self._job_dir = config.job_dir(spec.attempt_id)

    @property
    def job_dir(self) -> Path:
        return self._job_dir

    def open(self) -> WalledSlot:
        try:
            clean_slot(self.config, self.user, self.spec.attempt_id)
            self.cgroup.create(
                self.spec.memory_limit_bytes or self.config.default_memory_bytes,
                self.spec.pids_limit or self.config.default_pids,
            )
            self._folders()
            self._open_tunnels()
        except (OSError, CgroupError, ValueError) as err:
            self.close()
            raise SlotError(str(err)) from err
        log.info(
            "attempt %s: slot %d walled as %s (uid %d), memory %d MiB, pids %d, network %s",
            self.spec.attempt_id,
            self.spec.slot,
            self.user.name,
            self.user.uid,
            (self.spec.memory_limit_bytes or self.config.default_memory_bytes) >> 20,
            self.spec.pids_limit or self.config.default_pids,
            "loopback + egress proxy" if self.egress else "loopback only + tunnels",
        )
        return self

    def _folders(self) -> None:
        for parent in (self.config.root, self.config.jobs, self.config.runs):
            parent.mkdir(parents=True, exist_ok=True)
            os.lchown(parent, 0, 0)
            parent.chmod(0o711)  # traversable to one's own folder; nobody can list it
        wipe.make_private_folder(self._job_dir, self.user.uid, self.user.gid, 0o700)
        wipe.make_private_folder(self.run_dir, 0, self.user.gid, 0o750)
        spec_copy = self.run_dir / "spec.json"
        self.spec.save(spec_copy)
        os.chown(spec_copy, 0, self.user.gid)
        spec_copy.chmod(0o640)
        if self.egress:
            shutil.copyfile(SLOT_INIT, self.run_dir / SLOT_INIT.name)
            (self.run_dir / SLOT_INIT.name).chmod(0o644)

    def _open_tunnels(self) -> None:
        gid = self.user.gid
        if self.config.model_gateway_address:
            self.tunnels.append(
                network.UnixListener(
                    self.run_dir / "model.sock", gid, network.forward_to(self.config.model_gateway_address)
                )
            )
        if self.config.voice_service_address:
            self.tunnels.append(
                network.UnixListener(
                    self.run_dir / "voice.sock", gid, network.forward_to(self.config.voice_service_address)
                )
            )
        if self.egress:
            self.tunnels.append(
                network.UnixListener(self.run_dir / "egress.sock", gid, network.egress_proxy())
            )

    def command(self, pipeline_command: Sequence[str]) -> list[str]:
        gpus = devices.gpus_for_slots(
            list(self.config.gpus), self.config.machine_slots, self.spec.slot, self.spec.slots
        )
        plan = sandbox.SandboxPlan(
            uid=self.user.uid,
            gid=self.user.gid,
            job_dir=self._job_dir,
            home=self.user.home,
            run_dir=self.run_dir,
            pipeline_dir=self.pipeline_dir,
            devices=tuple(devices.device_nodes(gpus)),
            read_only=self.config.read_only,
            bwrap=self.config.bwrap,
            setpriv=self.config.setpriv,
            present=present_system_folders(),
        )
        argv = sandbox.bwrap_argv(plan)
        if self.egress:
            argv += [
                self.config.slot_python,
                "-I",
                "-S",
                str(sandbox.RUN_DIR / SLOT_INIT.name),
                "--listen",
                str(network.EGRESS_PORT),
                "--to",
                str(sandbox.RUN_DIR / "egress.sock"),
                "--",
            ]
        return argv + expand_pipeline_command(pipeline_command, sandbox.PIPELINE_DIR)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(sandbox.HOME_DIR),
            "USER": self.user.name,
            "LOGNAME": self.user.name,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "GPUFLEET_JOB_SPEC": str(sandbox.RUN_DIR / "spec.json"),
            "GPUFLEET_JOB_DIR": str(sandbox.JOB_DIR),
            "GPUFLEET_PIPELINE_DIR": str(sandbox.PIPELINE_DIR),
        }
        env.update({k: base[k] for k in CLOCK_VARIABLES if k in base})
        for tunnel in self.tunnels:
            inside = str(sandbox.RUN_DIR / tunnel.path.name)
            if tunnel.path.name == "model.sock":
                env["GPUFLEET_MODEL_GATEWAY_SOCKET"] = inside
            elif tunnel.path.name == "voice.sock":
                env["GPUFLEET_VOICE_SERVICE_SOCKET"] = inside
        if self.egress:
            proxy = f"http://127.0.0.1:{network.EGRESS_PORT}"
            env.update({"HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy})
        return env

    def give(self, path: Path) -> None:
        # Before the job starts: nothing in the folder is the job's yet, so walking it is safe.
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            for name in [*dirnames, *filenames]:
                os.lchown(os.path.join(dirpath, name), self.user.uid, self.user.gid)
        os.lchown(path, self.user.uid, self.user.gid)
        path.chmod(0o700)

    def preexec(self) -> Callable[[], None] | None:
        targets = self.cgroup.procs_files()

        def join_cgroup() -> None:
            # Between fork and exec in the runner's child: only async-signal-safe calls.
            for path in targets:
                fd = os.open(path, os.O_WRONLY)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)

        return join_cgroup

    def out_of_memory(self) -> bool:
        return self.cgroup.oom_kills() > 0

    def signal(self, job_pid: int, signum: signal.Signals) -> None:
        if signum == signal.SIGKILL:
            self.cgroup.kill()
        else:
            self.cgroup.signal(signum)

    def close(self) -> None:
        for tunnel in self.tunnels:
            tunnel.close()
        self.tunnels.clear()
        close_slot(self.config, self.user, self.spec.attempt_id, self.cgroup)


def clean_slot(config: WallsConfig, user: SlotUser, acting_for: str) -> None:
    """What every slot's user leaves behind, removed (before and after each job, for the
    attempt ``acting_for``). Any other attempt still running on the slot is told first
    that the platform kills it, so its end is never taken for its job's own."""
    if config.attempts is not None and wipe.processes_of(user.uid):
        for files in platform_kills.live_attempts_on_slot(config.attempts, user.slot, sparing=acting_for):
            platform_kills.record_attempt_kill(files, f"slot {user.slot} wiped for attempt {acting_for}")
    wipe.kill_processes_of(user.uid)
    wipe.remove_ipc_of(user.uid)
    wipe.remove_owned_entries(SHARED_TEMP, user.uid)
    wipe.empty_folder(user.home)


def close_slot(config: WallsConfig, user: SlotUser, attempt_id: str, cgroup: JobCgroup) -> None:
    """Kill the job's cgroup whole, wipe the slot and remove the attempt's folders."""
    if not cgroup.kill():
        log.error("attempt %s: processes left in its cgroup after SIGKILL", attempt_id)
    cgroup.remove()
    clean_slot(config, user, attempt_id)
    wipe.remove_tree(config.job_dir(attempt_id))
    wipe.remove_tree(config.run_dir(attempt_id))


class WalledLauncher:
    """The default launcher: see the module docstring."""

    name = "bubblewrap"

    def __init__(self, config: WallsConfig) -> None:
        self.config = config

    def open_slot(self, spec: JobSpec, files: AttemptFiles, pipeline_dir: Path) -> OpenSlot:
        if not 0 <= spec.slot < len(self.config.users):
            raise SlotError(f"slot {spec.slot} has no user on this machine")
        return WalledSlot(self.config, spec, pipeline_dir).open()

    def reclaim(self, spec: JobSpec, files: AttemptFiles) -> None:
        if not 0 <= spec.slot < len(self.config.users):
            return
        cgroup = JobCgroup(self.config.cgroups, spec.attempt_id).adopt()
        with contextlib.suppress(OSError):
            close_slot(self.config, self.config.user(spec.slot), spec.attempt_id, cgroup)
