"""A real `gpufleet up` and the real Prometheus on the configuration `up` wrote, for the
end-to-end tests of what an operator sees: started, waited for, queried over Prometheus'
HTTP API, and stopped with every local machine they left.

Needs Debian's `prometheus` package (`scripts/bootstrap --dev` installs it as root); without
it these tests fail, never skip: CI must not pass without having scraped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from gpufleet.common import host_release
from tests.support.ports import free_block
from tests.support.postgres import free_port

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]
SERVICES = ("provisioner", "scheduler", "reaper", "sweeper")
T = TypeVar("T")


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` is not installed: `scripts/bootstrap --dev` installs Debian's prometheus "
            "package when run as root (apt-get install prometheus)"
        )
    return found


@dataclass
class Up:
    state_dir: Path
    scheduler: str
    metrics_ports: dict[str, int]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*GPUFLEET, *args, "--scheduler", self.scheduler, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def cli_json(self, *args: str) -> Any:
        done = self.cli(*args, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def logs_tail(self) -> str:
        return "\n".join(
            f"--- {log.name} ---\n{log.read_text(errors='replace')[-1500:]}"
            for log in sorted((self.state_dir / "logs").glob("*.log"))
        )


def read_until_ready(proc: subprocess.Popen[str], timeout: float = 90) -> list[str]:
    """What `gpufleet up` printed until it said ``ready.`` (fails with all of it if it
    exited or ``timeout`` passed first)."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("ready.") or proc.poll() is not None:
            break
    assert any(line.startswith("ready.") for line in lines), "".join(lines)
    return lines


@contextlib.contextmanager
def gpufleet_up(tmp_path: Path, *, speed: float = 1.0, env: dict[str, str] | None = None) -> Iterator[Up]:
    """`gpufleet up` on free ports, scraped every second; ``env`` is the environment's
    GPUFLEET_* settings, which `up` hands every service as a deployment would."""
    base = free_block(4)
    metrics_base = free_block(4, exclude=range(base, base + 4))
    state_dir = tmp_path / "var"
    args = [
        *GPUFLEET,
        "up",
        "--state-dir",
        str(state_dir),
        "--port-offset",
        str(base - 50051),
        "--metrics-port-offset",
        str(metrics_base - 9451),
        "--scrape-interval",
        "1",
    ]
    if speed != 1.0:
        args += ["--speed", repr(speed)]
    proc = subprocess.Popen(
        args,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        read_until_ready(proc)
        ports = {
            name: metrics_base + i for i, name in enumerate(("scheduler", "reaper", "provisioner", "sweeper"))
        }
        yield Up(state_dir, f"127.0.0.1:{base}", ports)
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=60)
        if proc.poll() is None:
            proc.kill()
        # Ctrl-C on `up` ends its local machines; a machine left by an `up` that was killed
        # instead is ended here, and the slot users and walls they took on the host given back.
        for pid_file in (state_dir / "machines").glob("*/disk/agent.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        assert host_release.release_stack(state_dir / "machines") == []


@contextlib.contextmanager
def prometheus_for(up: Up, tmp_path: Path, *, rules: Path | None = None) -> Iterator[str]:
    """The real Prometheus on the configuration `up` wrote, as the README runs it; its URL.
    With ``rules``, the configuration gains them as README says to add them (``rule_files``),
    evaluated every second."""
    config = up.state_dir / "prometheus.yml"
    if rules is not None:
        written = yaml.safe_load(config.read_text())
        written["global"]["evaluation_interval"] = "1s"
        written["rule_files"] = [str(rules)]
        config = tmp_path / "prometheus-with-rules.yml"
        config.write_text(yaml.safe_dump(written))
    checked = subprocess.run(
        [binary("promtool"), "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 60, "Prometheus to be ready", lambda: log.read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def api(url: str, path: str, **params: str) -> Any:
    """Prometheus' HTTP API; an error answer (a query that does not parse, say) fails with
    Prometheus' own message."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=10) as answer:
            body = json.load(answer)
    except urllib.error.HTTPError as refused:
        raise AssertionError(f"{path} {params}: {refused.read().decode(errors='replace')}") from None
    assert body["status"] == "success", body
    return body["data"]


def query(url: str, promql: str) -> list[tuple[dict[str, str], float]]:
    """An instant query's series: (labels, value)."""
    result = api(url, "query", query=promql)["result"]
    return [(r["metric"], float(r["value"][1])) for r in result]


def scalar(url: str, promql: str) -> float | None:
    """The value of a query that yields one series (None while it yields none)."""
    found = query(url, promql)
    assert len(found) <= 1, f"{promql} yields several series: {found}"
    return found[0][1] if found else None


def wait_for(
    check: Callable[[], T | None], timeout: float, what: str, detail: Callable[[], object] = lambda: ""
) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {detail()}")
