"""Kill records: which attempts a wipe of a slot tells, and what a runner reads back."""

from __future__ import annotations

from pathlib import Path

from gpufleet.agent import platform_kills
from gpufleet.agent.specs import AttemptResult, Outcome
from gpufleet.agent.statedir import StateDir
from tests.unit.agent.factories import spec, state_dir


def launched(state: StateDir, attempt_id: str, slot: int, *, ended: bool = False) -> None:
    files = state.attempt(attempt_id)
    files.folder.mkdir()
    spec(attempt_id, slot=slot).save(files.spec)
    if ended:
        AttemptResult(attempt_id, Outcome.SUCCEEDED).save(files.result)


def test_a_wipe_tells_only_the_live_attempts_on_its_slot_but_its_own(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    launched(state, "on-0", 0)
    launched(state, "wiper", 0)
    launched(state, "ended-on-0", 0, ended=True)
    launched(state, "on-1", 1)
    (state.attempts / ".new-half-made").mkdir()  # a folder being made: no job yet
    found = platform_kills.live_attempts_on_slot(state.attempts, 0, sparing="wiper")
    assert [f.attempt_id for f in found] == ["on-0"]


def test_a_record_is_read_back_and_an_ended_attempt_gets_none(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    launched(state, "live", 0)
    launched(state, "ended", 0, ended=True)
    assert platform_kills.recorded_kill(state.attempt("live")) == ""
    platform_kills.record_attempt_kill(state.attempt("live"), "slot 0 wiped for attempt x")
    platform_kills.record_attempt_kill(state.attempt("ended"), "slot 0 wiped for attempt x")
    assert platform_kills.recorded_kill(state.attempt("live")) == "slot 0 wiped for attempt x"
    assert platform_kills.recorded_kill(state.attempt("ended")) == ""


def test_a_stopping_machine_speaks_for_every_attempt_until_it_starts_again(tmp_path: Path) -> None:
    state = state_dir(tmp_path)
    launched(state, "a", 0)
    launched(state, "b", 1)
    platform_kills.record_machine_stop(state.root, "the machine was stopped by the provisioner")
    assert {platform_kills.recorded_kill(state.attempt(a)) for a in ("a", "b")} == {
        "the machine was stopped by the provisioner"
    }
    platform_kills.clear_machine_stop(state.root)
    assert platform_kills.recorded_kill(state.attempt("a")) == ""
