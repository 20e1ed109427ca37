""".ci/run runs the README's test command and nothing else, and fails when pytest collects no
tests. Its behaviour is checked on a stand-in repository whose bootstrap and Python are stubs
that record their calls, so the real suite is not run from inside itself."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.quality._repo import REPO, run

TEST_COMMAND = "scripts/bootstrap --dev && .venv/bin/python -m pytest"


def test_ci_runs_the_readme_test_command() -> None:
    script = (REPO / ".ci" / "run").read_text()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in script
    commands = [
        line for line in script.splitlines() if "scripts/bootstrap" in line and not line.startswith("#")
    ]
    assert len(commands) == 1 and commands[0].startswith(TEST_COMMAND)
    assert os.stat(REPO / ".ci" / "run").st_mode & stat.S_IXUSR


def test_the_readme_names_the_same_test_command() -> None:
    assert TEST_COMMAND in (REPO / "README.md").read_text()


def _stub(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def fake_repo(tmp_path: Path) -> Path:
    (tmp_path / ".ci").mkdir()
    shutil.copy2(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    return tmp_path


def ci(fake_repo: Path, bootstrap_code: int, pytest_code: int) -> tuple[int, str, str]:
    log = fake_repo / "calls.log"
    _stub(fake_repo / "scripts" / "bootstrap", f'echo "bootstrap $* in $PWD" >> {log}; exit {bootstrap_code}')
    _stub(fake_repo / ".venv" / "bin" / "python", f'echo "python $* in $PWD" >> {log}; exit {pytest_code}')
    # Started from elsewhere: .ci/run must find the repository root itself.
    result = run([str(fake_repo / ".ci" / "run")], cwd=fake_repo / ".ci")
    calls = log.read_text() if log.exists() else ""
    return result.returncode, calls, result.stderr


def test_ci_bootstraps_then_runs_pytest_from_the_repository_root(fake_repo: Path) -> None:
    code, calls, _ = ci(fake_repo, bootstrap_code=0, pytest_code=0)
    assert code == 0
    assert calls.splitlines() == [f"bootstrap --dev in {fake_repo}", f"python -m pytest in {fake_repo}"]


def test_ci_fails_when_pytest_collects_no_tests(fake_repo: Path) -> None:
    code, _, stderr = ci(fake_repo, bootstrap_code=0, pytest_code=5)
    assert code == 5
    assert "collected no tests" in stderr


def test_ci_fails_with_the_failing_tests(fake_repo: Path) -> None:
    code, _, _ = ci(fake_repo, bootstrap_code=0, pytest_code=1)
    assert code == 1


def test_ci_does_not_run_the_tests_when_bootstrap_fails(fake_repo: Path) -> None:
    code, calls, _ = ci(fake_repo, bootstrap_code=3, pytest_code=0)
    assert code == 3
    assert "python" not in calls
