"""The command line as typed: each new command's arguments land where the command reads
them, and the exit statuses the help promises are the ones the outcomes give."""

from __future__ import annotations

import pytest

from gpufleet.cli import outcomes
from gpufleet.cli.main import build_parser, main
from gpufleet.v1 import job_pb2


def parse(*argv: str) -> dict[str, object]:
    return vars(build_parser().parse_args(list(argv)))


def test_cancel_takes_several_ids_and_a_reason() -> None:
    args = parse("cancel", "8da88807", "3f0c", "--reason", "wrong input")
    assert args["jobs"] == ["8da88807", "3f0c"] and args["reason"] == "wrong input"
    with pytest.raises(SystemExit):
        parse("cancel")


@pytest.mark.parametrize(
    ("argv", "machine", "target"),
    [
        (["machines"], None, None),
        (["machines", "5e1b"], "5e1b", None),
        (["machines", "drain", "5e1b", "--timeout", "60"], "drain", "5e1b"),
        (["machines", "cordon", "5e1b"], "cordon", "5e1b"),
    ],
)
def test_machines_takes_an_id_or_an_action_and_an_id(argv: list[str], machine: str, target: str) -> None:
    args = parse(*argv)
    assert (args["machine"], args["target"]) == (machine, target)


@pytest.mark.parametrize(
    ("argv", "action", "names"),
    [
        (["workspaces"], None, []),
        (["workspaces", "pause", "a", "b"], "pause", ["a", "b"]),
        (["workspaces", "set-plan", "a", "studio"], "set-plan", ["a", "studio"]),
        (["workspaces", "create", "a", "--plan", "creator", "--paused"], "create", ["a"]),
    ],
)
def test_workspaces_takes_an_action_and_its_names(argv: list[str], action: str, names: list[str]) -> None:
    args = parse(*argv)
    assert (args["action"], args["names"]) == (action, names)


def test_an_unknown_workspace_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        parse("workspaces", "delete", "a")
    assert done.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_submit_sends_no_pool_or_version_unless_given() -> None:
    args = parse("submit", "--workspace", "w", "--wait")
    assert args["pool"] == "" and args["pipeline_version"] == "" and args["wait"] is True


def test_a_watch_interval_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["jobs", "--watch", "--interval", "0"])
    assert "--interval" in str(done.value.code)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (job_pb2.JOB_STATE_SUCCEEDED, 0),
        (job_pb2.JOB_STATE_FAILED, 3),
        (job_pb2.JOB_STATE_TIMED_OUT, 4),
        (job_pb2.JOB_STATE_CANCELLED, 5),
        (job_pb2.JOB_STATE_RUNNING, None),
        (job_pb2.JOB_STATE_QUEUED, None),
    ],
)
def test_a_jobs_outcome_is_its_exit_status(state: int, status: int | None) -> None:
    assert outcomes.of_job(state) == status


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (job_pb2.ATTEMPT_STATE_SUCCEEDED, 0),
        (job_pb2.ATTEMPT_STATE_FAILED, 3),
        (job_pb2.ATTEMPT_STATE_TIMED_OUT, 4),
        (job_pb2.ATTEMPT_STATE_CANCELLED, 5),
        (job_pb2.ATTEMPT_STATE_LOST, 6),
        (job_pb2.ATTEMPT_STATE_INFRA_ERROR, 6),
        (job_pb2.ATTEMPT_STATE_RUNNING, None),
    ],
)
def test_an_attempts_outcome_is_its_exit_status(state: int, status: int | None) -> None:
    assert outcomes.of_attempt(state) == status


def test_the_help_states_the_exit_statuses(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("submit", "logs"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "0 succeeded" in text and "3 failed" in text and "6 ended by the platform" in text


@pytest.mark.parametrize(
    ("last_attempt", "status"),
    [
        (job_pb2.ATTEMPT_STATE_FAILED, 3),  # its own code failed, its retries spent
        (job_pb2.ATTEMPT_STATE_LOST, 6),  # our failures spent its budget: the platform's end
        (job_pb2.ATTEMPT_STATE_INFRA_ERROR, 6),
        (None, 3),  # ended without running (its queue wait ran out)
    ],
)
def test_a_job_failed_by_the_platform_says_so_in_its_exit_status(
    last_attempt: int | None, status: int
) -> None:
    job = job_pb2.Job(state=job_pb2.JOB_STATE_FAILED)
    if last_attempt is not None:
        job.attempts.add(state=job_pb2.ATTEMPT_STATE_FAILED)
        job.attempts.add(state=last_attempt)
    assert outcomes.of_ended_job(job) == status
    job.state = job_pb2.JOB_STATE_SUCCEEDED
    assert outcomes.of_ended_job(job) == 0
