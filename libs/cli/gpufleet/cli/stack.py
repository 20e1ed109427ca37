"""Runs the whole system on the embedded default: every service its own process, real
gRPC between them, one SQLite file (or a PostgreSQL database the operator names), local
machines.

The CLI never imports a service: it starts each one as ``python -m gpufleet.<name>`` with
its settings in the environment, exactly as a deployment would.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpufleet.cli import addresses, local_machines, prometheus_config
from gpufleet.cli.credentials import OPERATOR, tls_dir, transport_for
from gpufleet.cli.state_lock import StateLock
from gpufleet.common import grpcclient
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority
from gpufleet.common.trust.transport import Transport

SERVICES = ("provisioner", "scheduler", "reaper", "sweeper")
DEPLOYMENT = "local"
# Each service's metrics listener: the same as its own Settings' default (a test keeps them equal).
DEFAULT_METRICS_PORTS = {"scheduler": 9451, "reaper": 9452, "provisioner": 9453, "sweeper": 9454}
# The certificate Prometheus scrapes with (Role.METRICS): the only one a listener answers.
SCRAPER = "metrics"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClockMismatch(RuntimeError):
    """The state dir's clock runs at another speed than the one asked for."""


class DatabaseUnreachable(RuntimeError):
    """The operator's database cannot be read before the stack starts."""


class PortsInUse(RuntimeError):
    """A port the stack would listen on is taken (another stack, or anything else)."""


def taken(port: int) -> bool:
    """Whether something listens on 127.0.0.1:``port`` (a port left in TIME_WAIT by a
    stack that just stopped is free: the services bind with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass
class StackConfig:
    state_dir: Path
    ports: dict[str, int]
    clock_speed: float = 1.0
    clock_origin: float | None = None
    # Extra settings per service (env names without the GPUFLEET_ prefix).
    overrides: dict[str, dict[str, str]] = field(default_factory=dict)
    log_format: str = "json"
    # Each service's metrics port; a service not named serves no metrics (the demo's).
    metrics_ports: dict[str, int] = field(default_factory=dict)
    scrape_interval_s: float = prometheus_config.DEFAULT_SCRAPE_INTERVAL_S
    # A database of the operator's (``postgresql+psycopg://…``) instead of the state dir's
    # SQLite file; empty: the SQLite file.
    external_database_url: str = ""

    def address(self, service: str) -> str:
        return f"127.0.0.1:{self.ports[service]}"

    def metrics_address(self, service: str) -> str:
        """Empty (no listener) when the service has no metrics port here: set explicitly, or
        the service would take its default port."""
        port = self.metrics_ports.get(service)
        return "" if port is None else f"127.0.0.1:{port}"

    @property
    def prometheus_config_path(self) -> Path:
        return self.state_dir / "prometheus.yml"

    @property
    def database_url(self) -> str:
        return self.external_database_url or f"sqlite:///{self.state_dir / 'gpufleet.sqlite'}"

    def database_has_run(self) -> bool:
        """Whether a control plane already wrote to this database: the SQLite file exists,
        or the PostgreSQL database holds the migrations' version table. Its times were then
        written on some clock, which :meth:`Stack.keep_clock` must not contradict."""
        if not self.external_database_url:
            return (self.state_dir / "gpufleet.sqlite").exists()
        # Asked of the migrations module in a process of its own: the CLI imports no
        # database library (its import contract; the services own the database).
        asked = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpufleet.common.db.migrate",
                "--database-url",
                self.external_database_url,
                "--has-run",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if asked.returncode in (0, 3):  # migrate's HAS_RUN, NEVER_RAN
            return asked.returncode == 0
        reason = (asked.stderr.strip().splitlines() or ["no answer"])[0]
        raise DatabaseUnreachable(f"cannot read the database at --database-url: {reason}")


@dataclass
class Stack:
    config: StackConfig
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    lock: StateLock | None = None
    # Every service's environment but its own settings, built by start().
    _env: dict[str, str] = field(default_factory=dict)

    def claim(self) -> StateLock:
        """The state folder's lock, and every port free: refused (StateDirInUse,
        PortsInUse) before anything is started or written, so a second stack never
        answers for the first."""
        if self.lock is None:
            self.lock = StateLock.take(self.config.state_dir)
        wanted = [(f"{n} gRPC", p) for n, p in self.config.ports.items()] + [
            (f"{n} metrics", p) for n, p in self.config.metrics_ports.items()
        ]
        busy = [f"{port} ({what})" for what, port in wanted if taken(port)]
        if busy:
            raise PortsInUse(
                f"port(s) {', '.join(busy)} already in use on 127.0.0.1 (another stack?): "
                "pass --port-offset and --metrics-port-offset, or stop it with `gpufleet down`"
            )
        # Where this stack serves, for the client commands given its --state-dir.
        addresses.write(self.config.state_dir, {n: self.config.address(n) for n in self.config.ports})
        return self.lock

    def common_env(self) -> dict[str, str]:
        cfg = self.config
        env = {
            "GPUFLEET_DATABASE_URL": cfg.database_url,
            "GPUFLEET_PROVISIONER_ADDRESS": cfg.address("provisioner"),
            "GPUFLEET_SCHEDULER_ADDRESS": cfg.address("scheduler"),
            "GPUFLEET_LOG_FORMAT": cfg.log_format,
            "GPUFLEET_LOCAL_ROOT": str(cfg.state_dir / "machines"),
            # Checkpoints outlive the local machine that wrote them.
            "GPUFLEET_CHECKPOINT_DIR": str(cfg.state_dir / "checkpoints"),
        }
        if cfg.clock_speed != 1.0:
            env["GPUFLEET_CLOCK"] = "scaled"
            env["GPUFLEET_CLOCK_SPEED"] = repr(cfg.clock_speed)
            env["GPUFLEET_CLOCK_ORIGIN"] = repr(
                cfg.clock_origin if cfg.clock_origin is not None else time.time()
            )
        return env

    def ensure_credentials(self) -> Authority:
        """The deployment's CA and every part's certificate, made in ``<state dir>/tls`` on
        first start and reused after: the embedded default is mutual TLS like a deployment,
        with nothing for a newcomer to set up."""
        authority = Authority.ensure(tls_dir(self.config.state_dir), DEPLOYMENT)
        for name in (*SERVICES, OPERATOR, SCRAPER):
            authority.ensure_part(Identity(Role(name), DEPLOYMENT))
        return authority

    def write_prometheus_config(self, authority: Authority) -> Path | None:
        """``<state dir>/prometheus.yml`` for the services that serve metrics (None: none do)."""
        targets = [
            prometheus_config.ScrapeTarget(
                name, self.config.metrics_address(name), Identity(Role(name), DEPLOYMENT).server_name
            )
            for name in SERVICES
            if name in self.config.metrics_ports
        ]
        if not targets:
            return None
        path = self.config.prometheus_config_path
        rules: list[Path] = []
        if prometheus_config.ALERT_RULES is not None:
            # The deployment's alert rules, beside the configuration (rewritten with it).
            rules_path = path.with_name("alerts.yml")
            prometheus_config.write_atomically(rules_path, prometheus_config.ALERT_RULES.read_text())
            rules.append(rules_path)
        text = prometheus_config.render(
            targets, authority.files(SCRAPER), self.config.scrape_interval_s, rules
        )
        prometheus_config.write_atomically(path, text)
        return path

    def tls_env(self, authority: Authority, name: str) -> dict[str, str]:
        files = authority.files(name)
        env = {
            "GPUFLEET_DEPLOYMENT_ID": DEPLOYMENT,
            "GPUFLEET_TLS_CA_FILE": str(files.ca),
            "GPUFLEET_TLS_CERT_FILE": str(files.cert),
            "GPUFLEET_TLS_KEY_FILE": str(files.key),
        }
        if name == "provisioner":  # it gives each local machine its own certificate
            env["GPUFLEET_TLS_MACHINE_CA_CERT_FILE"] = str(authority.folder / "machine-ca.crt")
            env["GPUFLEET_TLS_MACHINE_CA_KEY_FILE"] = str(authority.folder / "machine-ca.key")
        return env

    def transport(self) -> Transport:
        """The operator's: what the CLI and the demo call with."""
        return transport_for(self.config.state_dir)

    def migrate(self) -> None:
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "gpufleet.common.db.migrate", "--database-url", self.config.database_url],
            check=True,
            capture_output=True,
        )

    def keep_clock(self) -> None:
        """The clock's speed (and a scaled clock's origin) is kept in the state dir
        (``clock.json``): restarted on the same state dir, the control plane goes on from
        the time it had, so it agrees with the times in its database. Another speed on the
        same state dir would put them out of step, so it is refused — real time included:
        a folder that ran at speed 1 is refused at speed 10 and the other way round. A
        folder with a database and no clock.json ran at speed 1 (before real time was
        written down too); so did a PostgreSQL database (``--database-url``) already
        migrated when the state dir has no clock.json. Call it before the database is made."""
        path = self.config.state_dir / "clock.json"
        if path.exists():
            stored = json.loads(path.read_text())
        elif self.config.database_has_run():
            stored = {"speed": 1.0, "origin": None}
        else:
            stored = None
        if stored is not None:
            if float(stored["speed"]) != self.config.clock_speed:
                raise ClockMismatch(
                    f"{self.config.state_dir} was started with --speed {float(stored['speed']):g}; "
                    f"start it with that speed, or use a fresh --state-dir"
                )
            if self.config.clock_origin is None and stored.get("origin") is not None:
                self.config.clock_origin = float(stored["origin"])
            if path.exists():
                return
        if self.config.clock_speed != 1.0 and self.config.clock_origin is None:
            self.config.clock_origin = time.time()
        origin = self.config.clock_origin if self.config.clock_speed != 1.0 else None
        path.write_text(json.dumps({"speed": self.config.clock_speed, "origin": origin}))

    def start(self, on_started: Callable[[str, str], None] | None = None) -> None:
        """Claim the state folder and the ports, migrate, then start every service and wait
        until each answers its health check. Whatever happens, :meth:`shutdown` after it
        stops what it started."""
        self.claim()
        self.keep_clock()
        self.migrate()
        authority = self.ensure_credentials()
        self.write_prometheus_config(authority)
        # Not inherited: the operator's certificate, and an agent's metrics address (local
        # machines share this host; one address would be bound by the first only).
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("GPUFLEET_TLS_") and k != "GPUFLEET_AGENT_METRICS_ADDRESS"
        }
        env.update(self.common_env())
        if self.config.clock_speed != 1.0:
            self.config.clock_origin = float(env["GPUFLEET_CLOCK_ORIGIN"])
        logs = self.config.state_dir / "logs"
        logs.mkdir(exist_ok=True)
        self._env = env
        for name in SERVICES:
            self.spawn(name)
        for name in SERVICES:
            self.wait_healthy(name)
            if on_started:
                on_started(name, self.config.address(name))
        exited = self.failed()
        if exited:  # a health answer that was not its own: say so before anything says ready
            raise RuntimeError(f"service(s) {', '.join(exited)} exited; see {logs}")

    def spawn(self, name: str) -> subprocess.Popen[bytes]:
        """Start service ``name`` with the environment :meth:`start` built (it is also how a
        supervisor — the soak's, standing in for Kubernetes — restarts one that exited)."""
        authority = Authority.open(tls_dir(self.config.state_dir))
        svc_env = {
            **self._env,
            **self.tls_env(authority, name),
            "GPUFLEET_LISTEN_ADDRESS": self.config.address(name),
            "GPUFLEET_METRICS_ADDRESS": self.config.metrics_address(name),
        }
        svc_env.update({f"GPUFLEET_{k.upper()}": v for k, v in self.config.overrides.get(name, {}).items()})
        with open(self.config.state_dir / "logs" / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                [sys.executable, "-m", f"gpufleet.{name}"],
                env=svc_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.config.state_dir,
                start_new_session=True,
            )
        return self.processes[name]

    def wait_healthy(self, name: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        transport = self.transport()
        with grpcclient.open_channel(self.config.address(name), transport, Role(name)) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                proc = self.processes[name]
                if proc.poll() is not None:
                    log = (self.config.state_dir / "logs" / f"{name}.log").read_text(errors="replace")
                    raise RuntimeError(f"{name} exited with status {proc.returncode}:\n{log[-3000:]}")
                try:
                    resp = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                    if resp.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(f"{name} did not become healthy within {timeout:.0f}s")

    def failed(self) -> list[str]:
        return [n for n, p in self.processes.items() if p.poll() is not None]

    def shutdown(self, grace: float = 10.0) -> int:
        """Stop the services, then the local machines (only when this stack started
        services: a stack refused at its start touches nothing of the folder), then let go
        of the state folder. How many local machines were running."""
        if self.lock is None:
            return 0
        ended = 0
        if self.processes:
            self.stop(grace)
            ended = self.stop_local_machines()
        self.lock.release()
        self.lock = None
        return ended

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every service (each stops gracefully), then SIGKILL stragglers."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop_local_machines(self) -> int:
        """End every local machine of this state dir as its provisioner would stop it, and
        give back the slot users and walls they took on this host; how many ran."""
        return local_machines.stop_all(self.config.state_dir)
