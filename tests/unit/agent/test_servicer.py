"""AgentService handlers called directly: validation, idempotency, the durable hand-off
to the worker, paging. No process, no network: the state directory is the only effect."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gpufleet.agent.pauses import PauseWatch
from gpufleet.agent.samplers import RequestCounter, SimulatedSampler
from gpufleet.agent.servicer import AgentServicer, StateActivity
from gpufleet.agent.specs import AttemptResult, JobSpec, Outcome
from gpufleet.agent.statedir import StateDir
from gpufleet.agent.supervisor import startup_status
from gpufleet.common.clock import ManualClock
from gpufleet.common.errors import FailedPrecondition, InvalidArgument
from gpufleet.v1 import agent_service_pb2
from tests.unit.agent.factories import PIPELINE, FakeWatch, spec, start_request, state_dir

SLOTS = 4


def servicer(
    state: StateDir,
    watch: FakeWatch | None = None,
    pipeline: list[str] | None = None,
    pauses: PauseWatch | None = None,
) -> AgentServicer:
    requests = RequestCounter()
    return AgentServicer(
        machine_id="m-1",
        slots=SLOTS,
        state=state,
        supervisor=watch or FakeWatch(),
        sampler=SimulatedSampler(StateActivity(state, requests), random.Random(0)),
        requests=requests,
        clock=ManualClock(),
        pipeline_command=pipeline or PIPELINE,
        pauses=pauses,
    )


def launched(state: StateDir, job: JobSpec, *, ended: bool = False) -> None:
    """What the worker leaves behind once it has launched ``job``."""
    files = state.attempt(job.attempt_id)
    files.folder.mkdir()
    job.save(files.spec)
    files.runner_pid.write_text("4242\n")
    if ended:
        AttemptResult(job.attempt_id, Outcome.SUCCEEDED).save(files.result)


def test_start_job_hands_the_spec_to_the_worker_once(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    agent = servicer(state)
    request = start_request("a-1", slot=2, payload="$(reboot)\n`id`")
    request.time_limit.FromSeconds(90)
    assert not agent.StartJob(request, None).already_running
    assert agent.StartJob(request, None).already_running
    assert state.pending_ids() == ["a-1"]
    handed = JobSpec.load(state.inbox_spec("a-1"))
    assert handed.tenant_values == {"payload": "$(reboot)\n`id`"}
    assert (handed.slot, handed.slots, handed.time_limit_s) == (2, 1, 90.0)
    assert [p.name for p in state.inbox.iterdir()] == ["a-1.json"]  # no staging file left


@pytest.mark.parametrize("where", ["running", "ended", "finished"])
def test_start_job_is_idempotent_whatever_became_of_the_attempt(tmp_path: Path, where: str) -> None:
    state = state_dir(tmp_path)
    launched(state, spec("a-1"), ended=where != "running")
    if where == "finished":
        state.attempt("a-1").folder.rename(state.finished / "a-1")
    assert servicer(state).StartJob(start_request("a-1"), None).already_running
    assert state.pending_ids() == []


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (start_request(""), "attempt_id"),
        (start_request("../escape"), "attempt_id"),
        (start_request("a/b"), "attempt_id"),
        (start_request("x" * 200), "attempt_id"),
        (start_request("a-1", job_id=""), "job_id"),
        (start_request("a-1", slot=-1), "slot"),
        (start_request("a-1", slot=SLOTS), "slot"),
        (start_request("a-1", slot=1, slots=SLOTS), "slots"),
        (start_request("a-1", slot=0, slots=-2), "slots"),
    ],
)
def test_bad_start_requests_name_the_field(tmp_path: Path, request_: object, field: str) -> None:
    state = state_dir(tmp_path)
    with pytest.raises(InvalidArgument) as caught:
        servicer(state).StartJob(request_, None)
    assert caught.value.field == field
    assert state.pending_ids() == []


def test_a_start_request_wrong_in_several_fields_names_each_one(tmp_path: Path) -> None:
    # One answer for the caller to fix everything at once, in the order the fields are read.
    request = start_request("../escape", job_id="", slot=1, slots=SLOTS)
    request.time_limit.seconds = -5
    request.pids_limit = -1
    request.tokens["gpu"] = "x" * 16
    state = state_dir(tmp_path)
    with pytest.raises(InvalidArgument) as caught:
        servicer(state).StartJob(request, None)
    assert [(v.field, v.reason) for v in caught.value.violations] == [
        ("attempt_id", "INVALID_FORMAT"),
        ("job_id", "REQUIRED"),
        ("slots", "OUT_OF_RANGE"),
        ("time_limit", "OUT_OF_RANGE"),
        ("pids_limit", "OUT_OF_RANGE"),
        ("tokens", "UNKNOWN_VALUE"),
    ]
    assert state.pending_ids() == []


def test_a_log_read_wrong_in_several_fields_names_each_one(tmp_path: Path) -> None:
    request = agent_service_pb2.ReadJobLogRequest(attempt_id="a/b", offset=-1, max_bytes=-3)
    with pytest.raises(InvalidArgument) as caught:
        servicer(state_dir(tmp_path)).ReadJobLog(request, None)
    assert [v.field for v in caught.value.violations] == ["attempt_id", "offset", "max_bytes"]


def test_a_negative_time_limit_is_refused(tmp_path: Path) -> None:
    request = start_request("a-1")
    request.time_limit.seconds = -5
    with pytest.raises(InvalidArgument) as caught:
        servicer(state_dir(tmp_path)).StartJob(request, None)
    assert caught.value.field == "time_limit"


def test_a_busy_slot_is_refused(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    launched(state, spec("running", slot=1))
    agent = servicer(state)
    with pytest.raises(FailedPrecondition, match="held by attempt running"):
        agent.StartJob(start_request("b", slot=1), None)
    with pytest.raises(FailedPrecondition):  # a film wants every slot
        agent.StartJob(start_request("film", slot=0, slots=SLOTS), None)
    assert not agent.StartJob(start_request("c", slot=2), None).already_running


def test_an_ended_attempt_frees_its_slot(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    launched(state, spec("done", slot=1), ended=True)
    assert not servicer(state).StartJob(start_request("next", slot=1), None).already_running


@pytest.mark.parametrize(
    "watch", [FakeWatch(is_alive=False), FakeWatch(ever_alive=False, is_alive=False, code=1)]
)
def test_no_job_is_accepted_without_a_worker(tmp_path: Path, watch: FakeWatch) -> None:
    state = state_dir(tmp_path)
    with pytest.raises(FailedPrecondition):
        servicer(state, watch).StartJob(start_request("a-1"), None)
    assert state.pending_ids() == []


def test_cancel_hands_a_request_to_the_worker_only_for_active_attempts(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    agent = servicer(state)
    agent.StartJob(start_request("pending"), None)
    launched(state, spec("running", slot=1))
    launched(state, spec("ended", slot=2), ended=True)
    cancel = agent_service_pb2.AgentServiceCancelJobRequest
    assert agent.CancelJob(cancel(attempt_id="pending", reason="user"), None).was_running
    assert agent.CancelJob(cancel(attempt_id="running"), None).was_running
    assert not agent.CancelJob(cancel(attempt_id="ended"), None).was_running
    assert not agent.CancelJob(cancel(attempt_id="unknown"), None).was_running
    assert not agent.CancelJob(cancel(attempt_id="../x"), None).was_running
    assert sorted(p.name for p in state.cancels.iterdir()) == ["pending", "running"]
    assert state.cancel_request("pending").read_text() == "user\n"
    with pytest.raises(InvalidArgument) as caught:
        agent.CancelJob(cancel(attempt_id=""), None)
    assert caught.value.field == "attempt_id"


def test_list_runners_pages_through_running_attempts(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    for index, attempt_id in enumerate(["c", "a", "b"]):
        launched(state, spec(attempt_id, slot=index))
    launched(state, spec("ended", slot=3), ended=True)
    agent = servicer(state)
    first = agent.ListRunners(agent_service_pb2.ListRunnersRequest(page_size=2), None)
    assert [r.attempt_id for r in first.runners] == ["a", "b"]
    assert first.runners[0].pid == 4242 and first.runners[0].job_id == "job-a"
    rest = agent.ListRunners(
        agent_service_pb2.ListRunnersRequest(page_size=2, page_token=first.next_page_token), None
    )
    assert [r.attempt_id for r in rest.runners] == ["c"]
    assert rest.next_page_token == ""
    with pytest.raises(InvalidArgument) as caught:
        agent.ListRunners(agent_service_pb2.ListRunnersRequest(page_token="garbage"), None)
    assert caught.value.field == "page_token"


def test_probe_and_startup_status(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    probe = servicer(state).Probe(agent_service_pb2.ProbeRequest(), None)
    assert (probe.machine_id, probe.slots, probe.sampler) == ("m-1", SLOTS, "simulated")
    assert probe.worker_alive and probe.startup_complete and probe.startup_error == ""

    missing = servicer(state, pipeline=["/nonexistent/pipeline", "--run"]).Probe(
        agent_service_pb2.ProbeRequest(), None
    )
    assert not missing.startup_complete
    assert "/nonexistent/pipeline" in missing.startup_error

    assert startup_status(state, FakeWatch(ever_alive=False, is_alive=False), PIPELINE) == (False, "")
    complete, error = startup_status(state, FakeWatch(ever_alive=False, is_alive=False, code=3), PIPELINE)
    assert not complete and "code 3" in error
    state.startup_error.write_text("")
    assert startup_status(state, FakeWatch(), PIPELINE) == (False, "start-up failed (no details recorded)")


def test_samples_count_start_and_cancel_calls(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    agent = servicer(state)
    sample = agent_service_pb2.SampleUtilizationRequest()
    assert agent.SampleUtilization(sample, None).requests_since_last_sample == 0
    agent.StartJob(start_request("a-1"), None)
    agent.CancelJob(agent_service_pb2.AgentServiceCancelJobRequest(attempt_id="nope"), None)
    busy = agent.SampleUtilization(sample, None)
    assert busy.requests_since_last_sample == 2
    assert busy.running_attempts == 1  # accepted, not yet launched, already busy
    assert busy.gpu_utilization_percent > 0
    assert agent.SampleUtilization(sample, None).requests_since_last_sample == 0
