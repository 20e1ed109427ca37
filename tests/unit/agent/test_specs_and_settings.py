"""What crosses process boundaries: specs and results survive a round trip byte for byte;
settings come from the environment with the clock pinned for children."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufleet.agent.settings import Settings
from gpufleet.agent.specs import AttemptResult, JobSpec, Outcome
from gpufleet.v1 import job_pb2

PAYLOADS = {"a": "$(touch /tmp/x)", "b": "; rm -rf /", "c": "`id`", "d": "'\"\n\t\\", "e": "\u0000nul 🎬"}


def test_a_spec_round_trips_every_byte(tmp_path: Path) -> None:
    spec = JobSpec(
        attempt_id="a-1",
        job_id="j",
        slot=1,
        slots=2,
        kind="film",
        pipeline_version="v9",
        workspace="w",
        request_id="r",
        tenant_values=PAYLOADS,
        time_limit_s=32400,
    )
    spec.save(tmp_path / "spec.json")
    assert JobSpec.load(tmp_path / "spec.json") == spec
    assert list(spec.occupies()) == [1, 2]


def test_a_result_round_trips(tmp_path: Path) -> None:
    result = AttemptResult("a-1", Outcome.TIMED_OUT, exit_code=143, slot_seconds=1.5, message="m")
    result.save(tmp_path / "result.json")
    assert AttemptResult.load(tmp_path / "result.json") == result
    assert AttemptResult.load(tmp_path / "absent.json") is None


def test_outcomes_are_the_attempt_states_of_the_contract() -> None:
    assert Outcome.SUCCEEDED.to_proto() == job_pb2.ATTEMPT_STATE_SUCCEEDED
    assert Outcome.INFRA_ERROR.to_proto() == job_pb2.ATTEMPT_STATE_INFRA_ERROR
    assert Outcome.TIMED_OUT.to_proto() == job_pb2.ATTEMPT_STATE_TIMED_OUT


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUFLEET_MACHINE_ID", "m-7")
    monkeypatch.setenv("GPUFLEET_AGENT_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUFLEET_SLOTS", "3")
    monkeypatch.setenv("GPUFLEET_PIPELINE_COMMAND", '["/opt/pipeline/bin/run", "--episode", "$(x)"]')
    settings = Settings()
    assert (settings.machine_id, settings.agent_state_dir, settings.slots) == ("m-7", tmp_path, 3)
    assert settings.pipeline_command == ["/opt/pipeline/bin/run", "--episode", "$(x)"]


def test_the_default_pipeline_is_the_sample_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_MACHINE_ID", "m-7")
    # Installed per version and run by the system's Python: slot users cannot read ours.
    assert Settings().pipeline_command == ["python3", "-I", "{pipeline_dir}/sample_pipeline.py"]


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"GPUFLEET_MACHINE_ID": "m", "GPUFLEET_PIPELINE_COMMAND": "[]"},
        {"GPUFLEET_MACHINE_ID": "m", "GPUFLEET_SLOTS": "0"},
    ],
)
def test_bad_settings_are_refused(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    monkeypatch.delenv("GPUFLEET_MACHINE_ID", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError):
        Settings()


def test_children_share_a_scaled_clock_s_origin() -> None:
    settings = Settings(machine_id="m", clock="scaled", clock_speed=20)
    env = settings.child_env({"PATH": "/bin"})
    assert env["GPUFLEET_CLOCK"] == "scaled"
    assert float(env["GPUFLEET_CLOCK_SPEED"]) == 20
    assert float(env["GPUFLEET_CLOCK_ORIGIN"]) == settings.clock_origin
    assert settings.child_env({})["GPUFLEET_CLOCK_ORIGIN"] == env["GPUFLEET_CLOCK_ORIGIN"]


def test_an_agents_host_wide_names_are_its_deployments_and_machines(tmp_path: Path) -> None:
    def names(deployment: str, machine: str, state: Path) -> tuple[str, Path, str]:
        s = Settings(deployment_id=deployment, machine_id=machine, agent_state_dir=state)
        return s.resolved_slot_user_prefix, s.resolved_walls_root, s.host_names.jobs_cgroup

    one = names("local", "machine-1", tmp_path / "a")
    assert one == names("local", "machine-1", tmp_path / "a")  # stable: a restart finds its own
    others = [
        names("other", "machine-1", tmp_path / "a"),
        names("local", "machine-2", tmp_path / "a"),
        names("local", "machine-1", tmp_path / "b"),
    ]
    for other in others:
        assert all(mine != theirs for mine, theirs in zip(one, other, strict=True)), other


def test_given_names_win_and_children_build_the_same_walls(tmp_path: Path) -> None:
    settings = Settings(machine_id="m", agent_state_dir=tmp_path, walls_name="3fa9c1d2-m0")
    assert settings.resolved_slot_user_prefix == "gf3fa9c1d2-m0-s"
    assert settings.resolved_walls_root == Path("/var/lib/gpufleet/walls/3fa9c1d2-m0")
    assert settings.host_names.jobs_cgroup == "gpufleet-jobs-3fa9c1d2-m0"
    derived = Settings(machine_id="m", agent_state_dir=tmp_path)
    env = derived.child_env({})
    assert env["GPUFLEET_WALLS_NAME"] == derived.host_names.walls_name
    explicit = Settings(machine_id="m", walls_root=tmp_path / "w", slot_user_prefix="gfesc-s")
    assert (explicit.resolved_walls_root, explicit.resolved_slot_user_prefix) == (tmp_path / "w", "gfesc-s")


@pytest.mark.parametrize("name", ["Upper", "-lead", "a" * 21, "has space", "dots.no"])
def test_a_walls_name_that_cannot_name_a_user_is_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        Settings(machine_id="m", walls_name=name)
