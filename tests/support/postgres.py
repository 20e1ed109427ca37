"""A throwaway PostgreSQL server started by the test run itself.

initdb refuses to run as root, so as root the server runs as the ``postgres`` OS user in
a temporary folder it owns. fsync and friends are off: the data is thrown away anyway.
The server listens only on a Unix socket and on 127.0.0.1 at a free port.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A port nothing listens on right now on 127.0.0.1 (for servers a test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise RuntimeError(f"PostgreSQL binary {name!r} not found; install the PostgreSQL server")


@dataclass
class PostgresServer:
    root: Path
    port: int
    user: str
    # pg_ctl's -o options it was started with (start_again uses them: same port, same socket).
    options: str = ""

    @property
    def socket_dir(self) -> str:
        return str(self.root / "s")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=self.user, dbname=database, autocommit=True
        ) as conn:
            conn.execute(sql)  # type: ignore[arg-type]

    def stop(self) -> None:
        subprocess.run(
            self._as_owner([_bin("pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "stop"]),
            capture_output=True,
            cwd=self.root,
            check=False,
        )
        # A whole run leaves a database per test (gigabytes); removing them took the run's
        # last 25 s. The files are removed by a process of their own, which the run does
        # not wait for (renamed first, so that nothing can find them meanwhile).
        trash = self.root.with_name(self.root.name + ".removing")
        try:
            self.root.rename(trash)
        except OSError:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        subprocess.Popen(
            ["rm", "-rf", "--", str(trash)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def shut_down(self, mode: str = "immediate") -> None:
        """Stop the server and keep its data, as a restart or a failover stops it:
        ``immediate`` drops every connection at once, like a crash (no checkpoint);
        ``fast`` is an operator's restart (sessions told ``57P01``, then dropped)."""
        subprocess.run(
            self._as_owner([_bin("pg_ctl"), "-D", str(self.root / "data"), "-m", mode, "-w", "stop"]),
            capture_output=True,
            cwd=self.root,
            check=True,
        )

    def start_again(self) -> None:
        """Start the server :meth:`shut_down` stopped, on the same port, with its data
        (after ``immediate``, PostgreSQL's crash recovery replays its WAL first)."""
        subprocess.run(
            self._as_owner(
                [
                    _bin("pg_ctl"),
                    "-D",
                    str(self.root / "data"),
                    "-o",
                    self.options,
                    "-l",
                    str(self.root / "log"),
                    "-w",
                    "start",
                ]
            ),
            capture_output=True,
            cwd=self.root,
            check=True,
        )

    def _as_owner(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", "postgres", "--", *argv]
        return argv


def start_postgres(*, durable_commits: bool = False) -> PostgresServer:
    """initdb + start; ready in about a second.

    ``durable_commits`` keeps ``synchronous_commit`` on, for a server a test stops with
    ``immediate`` (tests/integration/outage): off, a commit acknowledged to a client may
    still be in the server's memory when it is killed, and the restart loses it — the
    test's setting, not the system's. fsync stays off either way: the operating system's
    cache outlives a killed server."""
    root = Path(tempfile.mkdtemp(prefix="gfpg-", dir="/tmp"))
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "postgres")
    server = PostgresServer(root=root, port=free_port(), user=user)
    (root / "s").mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        shutil.chown(root / "s", "postgres", "postgres")

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            server._as_owner(argv),
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        )

    run([_bin("initdb"), "-D", str(root / "data"), "-A", "trust", "-U", user, "--no-sync"])
    opts = (
        f"-p {server.port} -k {root / 's'} -c listen_addresses=127.0.0.1 -c fsync=off "
        f"-c synchronous_commit={'on' if durable_commits else 'off'} -c full_page_writes=off "
        "-c max_connections=300"
    )
    server.options = opts
    run([_bin("pg_ctl"), "-D", str(root / "data"), "-o", opts, "-l", str(root / "log"), "-w", "start"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            server.psql("SELECT 1")
            return server
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"PostgreSQL did not start; see {root / 'log'}")
