"""The agent's settings: one object, built in each process's ``main()`` and passed down.

The agent daemon, the worker, every runner and the job itself read the same
``GPUFLEET_*`` environment, because each is started by the one before it with that
environment. The clock is pinned before a child is started (:meth:`Settings.child_env`),
so a sped-up demo clock without an explicit origin still reads the same time in every
process of the machine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from gpufleet.agent.gpu_health import CRITICAL_XIDS, HealthPolicy
from gpufleet.common.host_names import HostNames, machine_walls_name
from gpufleet.common.settings import BaseServiceSettings

AGENT_VERSION = "0.1.0"

CLOCK_ENV = ("GPUFLEET_CLOCK", "GPUFLEET_CLOCK_SPEED", "GPUFLEET_CLOCK_ORIGIN", "GPUFLEET_CLOCK_FILE")


def default_pipeline_command() -> list[str]:
    """The stand-in workload shipped with gpufleet, installed per version like a real
    pipeline and run by the system's Python (slot users cannot read gpufleet's own)."""
    return ["python3", "-I", "{pipeline_dir}/sample_pipeline.py"]


class Settings(BaseServiceSettings):
    """Everything the agent, its worker and its runners are configured with."""

    listen_address: str = "127.0.0.1:50060"
    # Where the agent serves its metrics for Prometheus (README "Metrics"; 0.0.0.0:9460 on a
    # machine image). Its own variable, GPUFLEET_AGENT_METRICS_ADDRESS, and off by default:
    # a local machine is started with the provisioner's environment, whose
    # GPUFLEET_METRICS_ADDRESS is the provisioner's own port, and several local machines
    # share one host.
    metrics_address: str = Field(default="", validation_alias="GPUFLEET_AGENT_METRICS_ADDRESS")
    # Required: the id the control plane gave this machine (validated even when unset).
    machine_id: str = Field(default="", min_length=1, max_length=128, validate_default=True)
    agent_state_dir: Path = Path("/var/lib/gpufleet/agent")
    scheduler_address: str = "127.0.0.1:50051"
    slots: int = Field(default=1, ge=1, le=64)
    # A JSON argv list in the environment; never a shell string.
    pipeline_command: list[str] = Field(default_factory=default_pipeline_command)
    # Clock seconds between two worker heartbeats (the went-silent net reads them).
    heartbeat_s: float = Field(default=10.0, gt=0)
    # Clock seconds: first retry of an unacknowledged completion, doubled up to heartbeat_s.
    completion_retry_s: float = Field(default=1.0, gt=0)
    # Real seconds: how fast the worker and runners notice a new spec, a cancel or an exit.
    # Latency only; every rule (limits, cadences) is measured on the clock.
    poll_s: float = Field(default=0.2, gt=0, le=5)
    # Real seconds a job gets between SIGTERM and SIGKILL when it is cancelled or timed out
    # (a job stopped by its lease's fence gets at most a quarter of the lease's margin).
    kill_grace_s: float = Field(default=5.0, ge=0)
    # Clock seconds: the attempt lease assumed until the scheduler's first acknowledged
    # heartbeat states the one it grants (its attempt_lease_s). A runner whose attempt is
    # not renewed for half of the lease stops its job (docs/leases.md).
    assumed_lease_s: float = Field(default=90.0, gt=0)

    # The dead-man switch (dead_man.py): an idle machine no control-plane identity has called
    # for this long (clock seconds) stops itself — "shutdown" (a cloud image: shutdown -h),
    # "session" (a local machine: its processes end), "off" (a self-administered box).
    dead_man_after_s: float = Field(default=1800.0, gt=0)
    dead_man_action: Literal["off", "shutdown", "session"] = "shutdown"
    # Real seconds between two looks.
    dead_man_every_s: float = Field(default=10.0, gt=0)

    # The walls between slots (DESIGN §10). "off" is for a development machine without
    # root only: jobs then run as the agent's own user, and every log line says so.
    walls: Literal["on", "off"] = "on"
    # What makes this machine's host-wide names its own (gpufleet.common.host_names): slot
    # users gf<name>-s<n>, walls /var/lib/gpufleet/walls/<name>, job cgroups below
    # gpufleet-jobs-<name>. Empty: a hash of the deployment, machine id and state folder, so
    # two agents on one host never share a slot user, a folder or a cgroup (a local
    # machine is given its stack's and its number's). Pinned for the worker and runners.
    walls_name: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9-]{0,19})?$")
    # Where slot homes, job folders, run folders and pipeline versions live; every folder
    # above it must be traversable by others (slot users reach their own folder through it).
    # Empty: /var/lib/gpufleet/walls/<walls name>.
    walls_root: Path | None = None
    # Slot n runs as user <prefix><n>. Empty: gf<walls name>-s.
    slot_user_prefix: str = Field(default="", pattern=r"^([a-z_][a-z0-9_-]{0,24})?$")
    # A Python slot users can run (the in-sandbox egress forwarder).
    slot_python: str = "/usr/bin/python3"
    bwrap_path: str = "bwrap"
    setpriv_path: str = "setpriv"
    # Below which cgroup (v2) job cgroups go; empty: /gpufleet-jobs at the hierarchy's root.
    cgroup_parent: str = ""
    # Limits of a job whose kind names none.
    job_memory_limit_mb: int = Field(default=8192, ge=16)
    job_pids_limit: int = Field(default=1024, ge=8)
    # Where the tunnels in a job's /run/gpufleet forward to (host:port); empty: no tunnel.
    model_gateway_address: str = ""
    voice_service_address: str = ""
    # Clock seconds between two looks at a job's checkpoint folder (packed when it
    # changed), the largest checkpoint sent, and the bytes the worker sends a tick.
    checkpoint_every_s: float = Field(default=60.0, gt=0)
    checkpoint_max_bytes: int = Field(default=64 << 20, ge=1 << 10, le=1 << 30)
    checkpoint_send_per_tick_bytes: int = Field(default=8 << 20, ge=1 << 20)
    # A folder holding the pipeline's code, copied per version the first time a job needs
    # it; empty: the bundled sample pipeline.
    pipeline_source: Path | None = None

    # GPU health (gpu_health.py): real seconds between two reads of the ECC counts and
    # remapped rows (Xid events arrive as they happen), the real seconds before the one
    # retry of a failed NVML initialisation, volatile uncorrectable ECC errors that make a
    # GPU critical, correctable ones that raise a warning, and the Xids that are critical
    # (a JSON list; default: NVIDIA's catalogue's reset/reboot/RMA codes).
    gpu_health_poll_s: float = Field(default=10.0, gt=0)
    gpu_init_retry_after_s: float = Field(default=1.0, ge=0)
    gpu_ecc_uncorrectable_critical: int = Field(default=1, ge=1)
    gpu_ecc_correctable_warning: int = Field(default=100, ge=1)
    gpu_critical_xids: list[int] = Field(default_factory=lambda: sorted(CRITICAL_XIDS))

    @field_validator("agent_state_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        # Processes recognise each other by paths on their command lines: one spelling.
        return value.absolute()

    @field_validator("pipeline_command")
    @classmethod
    def _argv_not_empty(cls, value: list[str]) -> list[str]:
        if not value or not value[0]:
            raise ValueError("pipeline_command must be a non-empty JSON argv list")
        return value

    def gpu_health_policy(self) -> HealthPolicy:
        return HealthPolicy(
            critical_xids=frozenset(self.gpu_critical_xids),
            ecc_uncorrectable_critical=self.gpu_ecc_uncorrectable_critical,
            ecc_correctable_warning=self.gpu_ecc_correctable_warning,
        )

    @property
    def host_names(self) -> HostNames:
        """This machine's host-wide names (see ``walls_name``)."""
        return HostNames(
            self.walls_name or machine_walls_name(self.deployment_id, self.machine_id, self.agent_state_dir)
        )

    @property
    def resolved_walls_root(self) -> Path:
        return self.walls_root or self.host_names.walls_root

    @property
    def resolved_slot_user_prefix(self) -> str:
        return self.slot_user_prefix or self.host_names.slot_user_prefix

    @property
    def pipelines_root(self) -> Path:
        """Installed pipeline versions: beside the walls, or in the state dir without them."""
        if self.walls == "on":
            return self.resolved_walls_root / "pipelines"
        return self.agent_state_dir / "pipelines"

    def pin_clock_origin(self) -> None:
        """Fix a scaled clock's origin now, before this process or any child reads it.

        A scaled clock without an origin starts from each process's own start time; pinned
        here and handed down by :meth:`child_env`, every process on the machine reads one
        shared time.
        """
        if self.clock == "scaled" and self.clock_origin is None:
            self.clock_origin = time.time()

    def clock_env(self) -> dict[str, str]:
        """The ``GPUFLEET_CLOCK*`` variables that rebuild this process's clock in a child."""
        env = {"GPUFLEET_CLOCK": self.clock, "GPUFLEET_CLOCK_SPEED": repr(self.clock_speed)}
        if self.clock_origin is not None:
            env["GPUFLEET_CLOCK_ORIGIN"] = repr(self.clock_origin)
        if self.clock_file:
            env["GPUFLEET_CLOCK_FILE"] = self.clock_file
        return env

    def child_env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the clock and the walls name pinned, for the worker or a runner of
        this machine: each builds the same walls, whatever folder it starts in."""
        self.pin_clock_origin()
        return {**base, **self.clock_env(), "GPUFLEET_WALLS_NAME": self.host_names.walls_name}
