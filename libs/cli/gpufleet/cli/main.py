"""The ``gpufleet`` command.

gpufleet up / down            run the whole system (embedded default) on a state folder / stop it
gpufleet demo                 run it on a sped-up clock with a scripted scenario
gpufleet submit [--wait] ...  submit a GPU job; --wait follows it and exits with its outcome
gpufleet jobs [JOB] [--watch] list jobs (why a queued one waits), or one with its attempts
gpufleet cancel JOB...        cancel jobs
gpufleet logs JOB [--follow]  a job's log, its tokens redacted on the machine
gpufleet machines [ID]        machines with their liveness channels and idle timers, or one
gpufleet machines cordon | uncordon | drain | deregister ID
gpufleet pools | kinds | plans  the catalogue: pools (and their machines now), job kinds, plans
gpufleet workspaces [create | pause | resume | set-plan ...]
gpufleet certs issue ...      a client certificate of the deployment's CA (backend, machine)

Jobs and machines are named by their id or any unique prefix of it. Every listing takes
--json (numbers as numbers, every field present).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

from gpufleet.cli import addresses, catalogue, certs, down, jobs, logs, machines, ops, workspaces
from gpufleet.cli.addresses import DEFAULT_PORTS
from gpufleet.cli.credentials import DEFAULT_STATE_DIR
from gpufleet.cli.demo import run_demo
from gpufleet.cli.stack import (
    DEFAULT_METRICS_PORTS,
    ClockMismatch,
    PortsInUse,
    Stack,
    StackConfig,
)
from gpufleet.cli.state_lock import StateDirInUse
from gpufleet.common.signals import stop_on_signals

# How often a running `gpufleet up` renews the certificates that are due (services' last 30
# days and are renewed with a third of that left: hourly is far inside it).
RENEW_EVERY_S = 3600.0


def run_up(args: argparse.Namespace) -> int:
    ports = {name: port + args.port_offset for name, port in DEFAULT_PORTS.items()}
    metrics_offset = args.port_offset if args.metrics_port_offset is None else args.metrics_port_offset
    metrics_ports = {name: port + metrics_offset for name, port in DEFAULT_METRICS_PORTS.items()}
    outside = sorted({p for p in (*ports.values(), *metrics_ports.values()) if not 0 < p < 65536})
    if outside:
        print(
            f"gpufleet: port(s) {', '.join(map(str, outside))} out of range: check --port-offset "
            "(it shifts the gRPC ports 50051-50054 and the metrics ports 9451-9454) and "
            "--metrics-port-offset",
            file=sys.stderr,
        )
        return 2
    if args.scrape_interval <= 0:
        print("gpufleet: --scrape-interval is a positive number of seconds", file=sys.stderr)
        return 2
    if args.database_url and "://" not in args.database_url:
        print(
            "gpufleet: --database-url is a SQLAlchemy URL such as "
            "postgresql+psycopg://user@host:5432/gpufleet",
            file=sys.stderr,
        )
        return 2
    config = StackConfig(
        state_dir=Path(args.state_dir).resolve(),
        external_database_url=args.database_url,
        ports=ports,
        clock_speed=args.speed,
        log_format="json",
        metrics_ports=metrics_ports,
        scrape_interval_s=args.scrape_interval,
        # Local machines' agents take any free port (each reports its own): a fixed 50060 + n
        # would be taken by machine n of another stack on this host, unless asked for.
        overrides={}
        if "GPUFLEET_LOCAL_AGENT_BASE_PORT" in os.environ
        else {"provisioner": {"local_agent_base_port": "0"}},
    )
    stack = Stack(config)
    # The state folder names the stack's addresses (addresses.json) and its operator
    # certificate: the one flag a client command needs to reach it.
    flag = "" if args.state_dir == DEFAULT_STATE_DIR else f" --state-dir {args.state_dir}"
    stop = threading.Event()
    # Both stop it, even when started in the background where SIGINT starts out ignored.
    stop_on_signals(stop)
    try:
        try:
            lock = stack.claim()
        except (StateDirInUse, PortsInUse) as exc:
            print(f"gpufleet: {exc}", file=sys.stderr)
            return 1
        if lock.stale_pid:
            print(f"  (the `gpufleet up` of pid {lock.stale_pid} ended without letting go of the folder)")
        database = "SQLite" if not args.database_url else "database at --database-url"
        print(
            f"gpufleet up — state in {config.state_dir} ({database} + local machines), logs in "
            f"{config.state_dir / 'logs'}",
            flush=True,
        )
        try:
            stack.start(
                on_started=lambda n, a: print(
                    f"  {n:<12} serving on {a}, metrics on {config.metrics_address(n)}", flush=True
                )
            )
        except ClockMismatch as exc:
            print(f"gpufleet: {exc}", file=sys.stderr)
            return 2
        except (PortsInUse, RuntimeError, TimeoutError) as exc:
            print(f"gpufleet: {exc}", file=sys.stderr)
            return 1
        if stop.is_set():  # Ctrl-C or `gpufleet down` while it started: never say ready
            return 0
        print(
            "ready. Try, in another terminal:\n"
            f"  gpufleet submit{flag} --workspace acme-studio --kind short_episode --set duration_s=60 "
            "--wait\n"
            f"  gpufleet jobs{flag} --watch\n  gpufleet machines{flag}\n  gpufleet pools{flag}\n"
            f'Metrics (each service\'s /metrics, mutual TLS; README "Metrics"):\n'
            f"  prometheus --config.file={config.prometheus_config_path} "
            f"--storage.tsdb.path={config.state_dir / 'prometheus'}\n"
            f"Ctrl-C (or `gpufleet down --state-dir {args.state_dir}`) stops the control plane and "
            "its local machines.",
            flush=True,
        )
        renewed = time.monotonic()
        while not stop.wait(0.5):
            if time.monotonic() - renewed >= RENEW_EVERY_S:
                # Services' certificates live 30 days; a stack left running renews each due
                # one in place, and every service takes the new files without a restart.
                renewed = time.monotonic()
                try:
                    stack.ensure_credentials()
                except OSError as exc:
                    print(f"gpufleet: could not renew certificates: {exc}", file=sys.stderr)
            failed = stack.failed()
            if failed:
                print(
                    f"gpufleet: service(s) {', '.join(failed)} exited; see {config.state_dir / 'logs'}",
                    file=sys.stderr,
                )
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        if stack.processes:
            print("stopping the control plane and its local machines ...", flush=True)
            ended = stack.shutdown()
            print(f"stopped ({ended} local machine(s) ended).", flush=True)
        else:  # refused at its start: nothing of the folder is touched
            stack.shutdown()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description="A control plane for rented GPU machines.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the whole system on the embedded default until interrupted")
    up.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help="SQLite file, local machines, logs and the deployment's certificates (default ./var)",
    )
    up.add_argument(
        "--port-offset",
        type=int,
        default=0,
        help="add to every default port (gRPC 50051-50054, metrics 9451-9454)",
    )
    up.add_argument(
        "--metrics-port-offset",
        type=int,
        default=None,
        help="add to the default metrics ports 9451-9454 instead (default: --port-offset)",
    )
    up.add_argument(
        "--scrape-interval",
        type=float,
        default=15.0,
        help="seconds between two scrapes in the written <state dir>/prometheus.yml (default 15)",
    )
    up.add_argument("--speed", type=float, default=1.0, help="clock speed factor (1 = real time)")
    up.add_argument(
        "--database-url",
        default=os.environ.get("GPUFLEET_DATABASE_URL", ""),
        help="a PostgreSQL database (postgresql+psycopg://user@host:port/db) instead of the state "
        "dir's SQLite file; migrated at start (default: GPUFLEET_DATABASE_URL, else SQLite)",
    )
    up.set_defaults(func=run_up)

    demo = sub.add_parser("demo", help="run the system on a sped-up clock with a scripted scenario")
    demo.add_argument("--speed", type=float, default=120.0, help="clock speed factor (default 120)")
    demo.add_argument("--state-dir", default=None, help="default: a new temporary directory")
    demo.add_argument("--timeout", type=float, default=110.0, help="give up after this many real seconds")
    demo.set_defaults(func=run_demo)

    down.add_parser(sub)

    def client(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--scheduler", default=None, help=addresses.flag_help("scheduler"))
        p.add_argument(
            "--state-dir",
            default=DEFAULT_STATE_DIR,
            help="where `gpufleet up` keeps the operator certificate (default ./var; "
            "GPUFLEET_TLS_* in the environment win)",
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    jobs.add_parsers(client)
    logs.add_parsers(client)
    machines.add_parsers(client)
    catalogue.add_parsers(client)
    workspaces.add_parsers(client)
    ops.add_parsers(sub, client)
    certs.add_parsers(sub)

    # The simulator is its own package (gpufleet-sim) over the services' pure decisions, which
    # the CLI may not import: the command hands its arguments to it in a process of its own.
    sim = sub.add_parser(
        "simulate",
        help="simulate a month of the fleet with the real decisions (see gpufleet simulate --help)",
        add_help=False,
    )
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    sim.set_defaults(func=run_simulate)
    return parser


def run_simulate(args: argparse.Namespace) -> int:
    try:
        import importlib.util

        found = importlib.util.find_spec("gpufleet.sim") is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        print(
            "gpufleet simulate: the simulator is not installed (pip install -e libs/sim[plot])",
            file=sys.stderr,
        )
        return 2
    os.execv(sys.executable, [sys.executable, "-m", "gpufleet.sim", *args.rest])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["simulate"]:
        # Every argument after the command is the simulator's own (its --help included).
        sys.exit(run_simulate(argparse.Namespace(rest=argv[1:])))
    args = build_parser().parse_args(argv)
    addresses.resolve(args)
    if getattr(args, "interval", 1.0) <= 0:
        sys.exit("gpufleet: --interval is a positive number of seconds")
    try:
        status = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`gpufleet jobs --json | head`): no traceback. Whatever is
        # still buffered goes nowhere, and the status is a pipe's (128 + SIGPIPE).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(141)
    sys.exit(status)


if __name__ == "__main__":
    main()
