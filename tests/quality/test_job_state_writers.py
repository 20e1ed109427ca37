"""One writer of jobs' and attempts' states (gpufleet.common.job_writer): no other module
of the services or the shared library assigns ``Job.state`` or ``Attempt.state``, updates
them in SQL, or calls the writer's unchecked ``set_job_state`` — every move goes through
the job lifecycle's table. The few other writers are listed here with why; the check
itself is shown to catch each kind of write it looks for."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.quality._repo import REPO

WRITER = "libs/common/gpufleet/common/job_writer.py"

# path -> why it may write a job's or an attempt's state itself.
ALLOWED: dict[str, str] = {
    WRITER: "the one writer",
    # The assign step's one bulk statement (QUEUED -> DISPATCHING with the attempt's count
    # and the pending reason cleared) beside the attempts it inserts: an attempt's start,
    # written for thousands of jobs a tick; the move is the table's (DISPATCH).
    "services/scheduler/gpufleet/scheduler/tick/dispatch.py": "the assign's bulk start",
}

_STATE_ENUMS = {"JobState", "AttemptState"}
_ROWS = re.compile(r"(^|_)(job|attempt|a|j)s?$", re.IGNORECASE)
_SQL = re.compile(r"UPDATE\s+(jobs|attempts)\s+SET\s+(state\s*=|[^;]*?,\s*state\s*=)", re.IGNORECASE)


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
    }


def _base(node: ast.expr) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def writes(source: str) -> list[str]:
    """The job- or attempt-state writes in ``source``, as ``line: what``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and target.attr == "state" and node.value is not None:
                    on_row = _ROWS.search(_base(target.value)) is not None
                    if on_row or _names(node.value) & _STATE_ENUMS:
                        found.append(f"{node.lineno}: assigns {ast.unparse(target)}")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if name in ("set_job_state", "set_jobs_state"):
                found.append(f"{node.lineno}: calls {name}")
            if name == "values":
                for kw in node.keywords:
                    if kw.arg == "state" and _names(kw.value) & _STATE_ENUMS:
                        found.append(f"{node.lineno}: updates state= {ast.unparse(kw.value)}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _SQL.search(node.value):
            found.append(f"{node.lineno}: SQL sets a job's or an attempt's state")
    return found


def _production_modules() -> list[Path]:
    roots = [REPO / "libs" / "common", REPO / "libs" / "cli", *sorted((REPO / "services").iterdir())]
    # The agent keeps no job rows: its ``state`` objects are its own processes'.
    return sorted(
        p
        for root in roots
        if root.name != "agent"
        for p in root.rglob("*.py")
        if "migrations" not in p.parts and ".venv" not in p.parts
    )


def test_no_module_but_the_listed_writers_writes_a_jobs_or_an_attempts_state() -> None:
    offenders = {}
    for path in _production_modules():
        rel = str(path.relative_to(REPO))
        if rel in ALLOWED:
            continue
        found = writes(path.read_text())
        if found:
            offenders[rel] = found
    assert offenders == {}, "write through gpufleet.common.job_writer instead"


def test_the_listed_writers_exist_and_the_scan_reads_the_services() -> None:
    for rel in ALLOWED:
        assert (REPO / rel).exists(), rel
    scanned = {str(p.relative_to(REPO)) for p in _production_modules()}
    assert "services/scheduler/gpufleet/scheduler/worker_service.py" in scanned
    assert "libs/common/gpufleet/common/attempts.py" in scanned
    assert writes((REPO / WRITER).read_text())  # the writer itself is seen writing


@pytest.mark.parametrize(
    "source",
    [
        "job.state = 'FAILED'",
        "attempt.state = AttemptState.LOST.value",
        "row.state = JobState.QUEUED.value",
        "set_job_state(session, job, JobState.FAILED, now, 'x')",
        "session.execute(update(models.Job).values(state=JobState.QUEUED.value))",
        "SQL = 'UPDATE jobs SET status_message = :m, state = :s WHERE id = :id'",
        "SQL = 'UPDATE attempts SET state = :s'",
    ],
)
def test_the_check_catches_each_kind_of_write(source: str) -> None:
    assert writes(source)


@pytest.mark.parametrize(
    "source",
    [
        "machine.state = 'READY'",
        "self.state = state",
        "row.state = IncidentState.RESOLVED.value",
        "move_job(session, job, JobState.FAILED, now, by=Mover.REQUEST_WATCHDOG, message='x')",
        "SQL = 'UPDATE jobs SET pending_reason = v.reason WHERE jobs.state = 1'",
    ],
)
def test_the_check_leaves_other_states_alone(source: str) -> None:
    assert writes(source) == []


def test_the_simulator_ends_attempts_with_the_lifecycles_decision_and_no_rule_of_its_own() -> None:
    """The simulator keeps its jobs in memory (its own records, written in place), but what
    an attempt's end does to its job is the services' decision, never a copy: no budget
    compared, no back-off computed in the world."""
    tree = ast.parse((REPO / "libs" / "sim" / "gpufleet" / "sim" / "world.py").read_text())
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "decide_attempt_end" in calls
    budgets = {"retry_budget", "lost_retry_budget", "losses", "failures", "lost_retry_backoff_s"}
    copies = [
        f"{n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Compare | ast.BinOp) and _names(n) & budgets
    ]
    assert copies == []
