"""The local driver: a machine is an agent process (plus its worker) on this host.

The embedded default runs the whole system on one laptop, so "renting a machine" means
giving it a folder and starting its agent. Each machine lives in
``<root>/<machine_id>/``::

    instance.json   machine id, provider instance id (local-<hex>), labels, launch time,
                    the status we last asked for, its port index, the agent's process group
    disk/           the agent's state dir (GPUFLEET_AGENT_STATE_DIR); kept across stop/start
    logs/agent.log  the agent's stdout and stderr

A machine's host-wide names — its slot users, walls folder and jobs' cgroup — come from
its walls name, ``<hash of this root>-m<index>``
(:mod:`gpufleet.common.host_names`): any number of stacks (other roots) and test runs
share the host without one wiping another's slots, and the next machine of this stack
with the same index re-uses them. Destroying a machine gives them back.

Everything is read back from the host, never from memory, so a restarted provisioner
sees exactly what exists: a machine is RUNNING while its agent's process group has a live
process and STOPPED otherwise (a crashed agent is a machine that went down). The agent
writes ``disk/agent.port`` once it serves; until then the machine is RUNNING without an
agent address — like a real VM whose boot hangs.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet.common import host_release
from gpufleet.common.clock import Clock, ScaledClock
from gpufleet.common.errors import AlreadyExists, InvalidArgument
from gpufleet.common.host_names import HostNames, local_walls_name
from gpufleet.common.provider_errors import InstanceNotFound, InsufficientCapacity, NotYetDone, Transient
from gpufleet.common.trust.pki import MachineIssuer
from gpufleet.provisioner.drivers import local_procs
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    CapacityType,
    InstanceInfo,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
    instance_labels,
)
from gpufleet.provisioner.drivers.local_faults import PROXY_PORT_FILE, FaultInjection

log = logging.getLogger(__name__)

RECORD_FILE = "instance.json"
# The agent's dead-man switch leaves this on its disk (gpufleet.agent.dead_man.MARKER; the
# provisioner may not import the agent).
DEAD_MAN_MARKER = "stopped_by_itself"
# Written on its disk before a machine's processes are ended, so a runner that sees its job
# killed knows the platform did it (gpufleet.agent.platform_kills.MACHINE_RECORD).
STOPPING_MARKER = "machine.stopping"
PORT_FILE = "agent.port"
PID_FILE = "agent.pid"
DEFAULT_AGENT_COMMAND = (sys.executable, "-m", "gpufleet.agent")
# Variables of the provisioner's own process that must not leak into an agent's: its own
# files, and host-wide names one agent would then share with every other.
_NOT_INHERITED = (
    "GPUFLEET_PORT_FILE",
    "GPUFLEET_HEALTH_LISTEN_ADDRESS",
    "GPUFLEET_WALLS_NAME",
    "GPUFLEET_WALLS_ROOT",
    "GPUFLEET_SLOT_USER_PREFIX",
)
# The provisioner's own credential never reaches a machine: a machine gets its own.
_OWN_PREFIXES = ("GPUFLEET_TLS_",)


@dataclass(frozen=True)
class _Record:
    """The contents of instance.json."""

    machine_id: str
    provider_instance_id: str
    labels: dict[str, str]
    launch_time: str
    status: str  # what we last asked for: RUNNING or STOPPED
    index: int
    pgid: int | None
    offering: dict[str, Any]


class LocalDriver:
    """Machines as local agent processes; see the module docstring for the layout.

    ``base_port`` > 0 gives machine *n* the fixed port ``base_port + n``; 0 lets each
    agent bind an ephemeral port and report it. ``max_machines`` (0 = unlimited) is this
    host's capacity: beyond it, create is InsufficientCapacity.
    """

    provider = Provider.LOCAL

    def __init__(
        self,
        root: Path,
        deployment_id: str,
        clock: Clock,
        *,
        scheduler_address: str,
        agent_command: Sequence[str] = DEFAULT_AGENT_COMMAND,
        base_port: int = 0,
        agent_wait_s: float = 15.0,
        stop_grace_s: float = 5.0,
        max_machines: int = 0,
        host: str = "127.0.0.1",
        machine_issuer: MachineIssuer | None = None,
    ) -> None:
        self.machine_issuer = machine_issuer
        self.root = Path(root)
        self.deployment_id = deployment_id
        self.clock = clock
        self.scheduler_address = scheduler_address
        self.agent_command = tuple(agent_command)
        self.base_port = base_port
        self.agent_wait_s = agent_wait_s
        self.stop_grace_s = stop_grace_s
        self.max_machines = max_machines
        self.host = host
        self._lock = threading.Lock()
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        # The soak's fault-injection hook: a no-op unless its file exists under the root.
        self.faults = FaultInjection(self.root)

    # ---- the Driver contract -------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        self.faults.before("create")
        if not _safe_name(spec.machine_id):
            raise InvalidArgument("must name a folder under the local root", field="machine_id")
        with self._host_lock():
            existing = self._read(spec.machine_id)
            if existing is not None:
                if existing.labels.get(DEPLOYMENT_LABEL) != self.deployment_id:
                    raise AlreadyExists(f"machine folder {spec.machine_id} belongs to another deployment")
                return self.faults.after("create", self._info(existing))
            records = self._all_records()
            if self.max_machines and len(records) >= self.max_machines:
                raise InsufficientCapacity(f"this host runs at most {self.max_machines} local machines")
            used = {r.index for r in records}
            record = _Record(
                machine_id=spec.machine_id,
                provider_instance_id=f"local-{uuid.uuid4().hex[:12]}",
                labels=instance_labels(self.deployment_id, spec.machine_id, spec.labels),
                launch_time=self.clock.now().isoformat(),
                status=InstanceStatus.RUNNING.value,
                index=next(n for n in range(len(used) + 1) if n not in used),
                pgid=None,
                offering=asdict(spec.offering),
            )
            folder = self._folder(spec.machine_id)
            # exist_ok: a crash before the record was written leaves an empty folder behind.
            (folder / "disk").mkdir(parents=True, exist_ok=True)
            (folder / "logs").mkdir(exist_ok=True)
            self._write(record)  # before the spawn: a crash in between leaves it adoptable
            record = self._spawn(record)
        return self.faults.after("create", self._await_agent(record))

    def start(self, ref: InstanceRef) -> InstanceInfo:
        self.faults.before("start")
        with self._host_lock():
            record = self._require(ref)
            if self._alive(record):
                if record.status != InstanceStatus.RUNNING.value:  # a stop that has not finished
                    raise Transient(f"local machine {ref.machine_id} is still stopping")
                return self.faults.after("start", self._info(record))
            record = self._spawn(record)
        return self.faults.after("start", self._await_agent(record))

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        self.faults.before("stop")
        with self._host_lock():
            record = self._require(ref)
            record = replace(record, status=InstanceStatus.STOPPED.value)
            self._write(record)
            self._end(record)
            record = replace(record, pgid=None)
            self._write(record)
            return self.faults.after("stop", self._info(record))

    def destroy(self, ref: InstanceRef) -> bool:
        self.faults.before("destroy")
        with self._host_lock():
            record = self._find(ref)
            if record is None:
                return False
            self._write(replace(record, status=InstanceStatus.STOPPED.value))
            self._end(record)
            self._release(record)
            shutil.rmtree(self._folder(record.machine_id))
        return self.faults.after("destroy", True)

    def get(self, ref: InstanceRef) -> InstanceInfo:
        self.faults.before("get")
        return self.faults.after("get", self._info(self._require(ref)))

    def list(self) -> builtins.list[InstanceInfo]:
        self.faults.before("list")
        found = [
            self._info(r) for r in self._all_records() if r.labels.get(DEPLOYMENT_LABEL) == self.deployment_id
        ]
        return self.faults.after("list", found)

    # ---- folders and records -----------------------------------------------------------

    def _folder(self, machine_id: str) -> Path:
        return self.root / machine_id

    def host_names(self, index: int) -> HostNames:
        """The host-wide names of this stack's local machine number ``index``."""
        return HostNames(local_walls_name(self.root, index))

    def _release(self, record: _Record) -> None:
        """Give back the machine's slot users and walls folder (its processes are ended). What
        cannot be removed is said, not raised: the machine is gone either way, and the next
        machine with its number re-uses what is left."""
        for problem in host_release.release(self.host_names(record.index)):
            log.error("local machine %s: not given back: %s", record.machine_id, problem)

    @contextlib.contextmanager
    def _host_lock(self) -> Iterator[None]:
        """One change at a time on this host: threads here, and other provisioners (flock)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock, (self.root / ".lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _read(self, machine_id: str) -> _Record | None:
        path = self._folder(machine_id) / RECORD_FILE
        try:
            return _Record(**json.loads(path.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            log.warning("ignoring unreadable local machine record %s: %s", path, exc)
            return None

    def _write(self, record: _Record) -> None:
        path = self._folder(record.machine_id) / RECORD_FILE
        tmp = path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(record), indent=2))
        os.replace(tmp, path)

    def _all_records(self) -> builtins.list[_Record]:
        if not self.root.is_dir():
            return []
        found = (self._read(p.name) for p in sorted(self.root.iterdir()) if p.is_dir())
        return [r for r in found if r is not None]

    def _find(self, ref: InstanceRef) -> _Record | None:
        record = self._read(ref.machine_id) if _safe_name(ref.machine_id) else None
        if record is None or record.labels.get(DEPLOYMENT_LABEL) != self.deployment_id:
            return None
        if ref.provider_instance_id and ref.provider_instance_id != record.provider_instance_id:
            return None
        return record

    def _require(self, ref: InstanceRef) -> _Record:
        record = self._find(ref)
        if record is None:
            raise InstanceNotFound(f"no local machine {ref.machine_id} in deployment {self.deployment_id}")
        return record

    # ---- processes ---------------------------------------------------------------------

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                self._children.pop(pid, None)

    def _alive(self, record: _Record) -> bool:
        self._reap()
        return record.pgid is not None and bool(local_procs.group_members(record.pgid))

    def _agent_env(self, record: _Record) -> dict[str, str]:
        """The agent's environment: ours (clock settings travel this way) plus its identity."""
        env = {
            k: v for k, v in os.environ.items() if k not in _NOT_INHERITED and not k.startswith(_OWN_PREFIXES)
        }
        port = self.base_port + record.index if self.base_port else 0
        env.update(
            {
                "GPUFLEET_MACHINE_ID": record.machine_id,
                "GPUFLEET_DEPLOYMENT_ID": self.deployment_id,
                "GPUFLEET_LISTEN_ADDRESS": f"{self.host}:{port}",
                "GPUFLEET_AGENT_STATE_DIR": str((self._folder(record.machine_id) / "disk").resolve()),
                "GPUFLEET_SCHEDULER_ADDRESS": self.scheduler_address,
                "GPUFLEET_SLOTS": str(record.offering["slots"]),
                # Several local machines, of this stack and others, share this host: each
                # gets its own slot users, walls and cgroups, named for this stack and its
                # index so a later machine of the stack re-uses them (bounded, like
                # re-imaging a machine) instead of adding users without end.
                "GPUFLEET_WALLS_NAME": self.host_names(record.index).walls_name,
                # A local machine is a session of processes: its dead-man switch ends them.
                "GPUFLEET_DEAD_MAN_ACTION": "session",
            }
        )
        if self.machine_issuer is not None:
            # Born with its credential: issued into the machine's own folder, like a cloud
            # machine's instance metadata, and renewed at each boot.
            files = self.machine_issuer.issue(record.machine_id, self._folder(record.machine_id) / "tls")
            env.update(
                {
                    "GPUFLEET_TLS_CA_FILE": str(files.ca.resolve()),
                    "GPUFLEET_TLS_CERT_FILE": str(files.cert.resolve()),
                    "GPUFLEET_TLS_KEY_FILE": str(files.key.resolve()),
                }
            )
        if isinstance(self.clock, ScaledClock) and "GPUFLEET_CLOCK_ORIGIN" not in env:
            # Without a shared origin each agent would start its own scaled timeline.
            env["GPUFLEET_CLOCK_ORIGIN"] = repr(self.clock.origin)
        return env

    def _spawn(self, record: _Record) -> _Record:
        folder = self._folder(record.machine_id)
        # So we wait for this boot's answer, and a later crash is not taken for a self-stop.
        for stale in (PORT_FILE, PID_FILE, DEAD_MAN_MARKER, STOPPING_MARKER, PROXY_PORT_FILE):
            (folder / "disk" / stale).unlink(missing_ok=True)
        child = local_procs.spawn_session(
            self.agent_command, self._agent_env(record), folder, folder / "logs" / "agent.log"
        )
        self._children[child.pid] = child
        record = replace(record, status=InstanceStatus.RUNNING.value, pgid=child.pid)
        self._write(record)
        log.info("started local machine %s (agent pid %d)", record.machine_id, child.pid)
        return record

    def _await_agent(self, record: _Record) -> InstanceInfo:
        """Wait (bounded, real time) for the agent to report its port; a hung boot is not an error."""
        child = self._children.get(record.pgid or -1)
        local_procs.wait_until(
            lambda: self._agent_port(record) is not None or (child is not None and child.poll() is not None),
            self.agent_wait_s,
        )
        return self._info(record)

    def _end(self, record: _Record) -> None:
        if record.pgid is None:
            return
        # Before any signal: a job that dies of it is the platform's doing, not its own.
        (self._folder(record.machine_id) / "disk" / STOPPING_MARKER).write_text(
            "the machine was stopped by the provisioner\n"
        )
        if not local_procs.end_group(record.pgid, self.stop_grace_s, self._reap):
            raise NotYetDone(f"processes of local machine {record.machine_id} survived SIGKILL")
        log.info("ended every process of local machine %s", record.machine_id)

    def _agent_port(self, record: _Record) -> int | None:
        try:
            text = (self._folder(record.machine_id) / "disk" / self.faults.port_file()).read_text().strip()
            return int(text) if text else None
        except (OSError, ValueError):
            return None  # not written yet, or caught mid-write

    def _info(self, record: _Record) -> InstanceInfo:
        alive = self._alive(record)
        if record.status == InstanceStatus.RUNNING.value:
            status = InstanceStatus.RUNNING if alive else InstanceStatus.STOPPED
        else:
            status = InstanceStatus.STOPPING if alive else InstanceStatus.STOPPED
        port = self._agent_port(record) if status is InstanceStatus.RUNNING else None
        offering = Offering(
            **{
                **record.offering,
                "provider": Provider(record.offering["provider"]),
                "capacity_type": CapacityType(record.offering["capacity_type"]),
            }
        )
        return InstanceInfo(
            provider=Provider.LOCAL,
            provider_instance_id=record.provider_instance_id,
            machine_id=record.machine_id,
            status=status,
            labels=dict(record.labels),
            launch_time=datetime.fromisoformat(record.launch_time),
            region=offering.region,
            zone=offering.zone,
            instance_type=offering.instance_type,
            capacity_type=offering.capacity_type,
            agent_address=f"{self.host}:{port}" if port else "",
            stopped_by_itself=status is InstanceStatus.STOPPED and self._stopped_itself(record),
        )

    def _stopped_itself(self, record: _Record) -> bool:
        """The agent left its dead-man marker on the machine's disk before it ended."""
        return (self._folder(record.machine_id) / "disk" / DEAD_MAN_MARKER).exists()


def _safe_name(machine_id: str) -> bool:
    """A machine id names a folder: refuse anything that could leave the root."""
    return bool(machine_id) and "/" not in machine_id and machine_id not in (".", "..")
