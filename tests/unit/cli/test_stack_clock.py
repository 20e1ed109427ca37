"""`gpufleet up --speed N` restarted on the same state dir keeps the clock it started with;
another speed there is refused, real time included."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli.stack import ClockMismatch, Stack, StackConfig


def stack(state_dir: Path, speed: float) -> Stack:
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = {"provisioner": 1, "scheduler": 2}
    return Stack(StackConfig(state_dir=state_dir, ports=ports, clock_speed=speed))


def test_a_restart_at_the_same_speed_keeps_the_first_origin(tmp_path: Path) -> None:
    first = stack(tmp_path, 60.0)
    first.keep_clock()
    origin = first.config.clock_origin
    assert origin is not None
    again = stack(tmp_path, 60.0)
    again.keep_clock()
    assert again.config.clock_origin == origin
    assert again.common_env()["GPUFLEET_CLOCK_ORIGIN"] == repr(origin)


@pytest.mark.parametrize("speed", [1.0, 30.0])
def test_another_speed_on_the_same_state_dir_is_refused(tmp_path: Path, speed: float) -> None:
    stack(tmp_path, 60.0).keep_clock()
    with pytest.raises(ClockMismatch, match="--speed 60"):
        stack(tmp_path, speed).keep_clock()


def test_real_time_is_written_down_and_another_speed_then_refused(tmp_path: Path) -> None:
    s = stack(tmp_path, 1.0)
    s.keep_clock()
    assert s.config.clock_origin is None and (tmp_path / "clock.json").exists()
    stack(tmp_path, 1.0).keep_clock()  # the same speed again is fine
    with pytest.raises(ClockMismatch, match="--speed 1;"):
        stack(tmp_path, 10.0).keep_clock()


def test_a_folder_that_ran_before_clock_json_was_written_at_speed_1_is_taken_as_real_time(
    tmp_path: Path,
) -> None:
    """Before real time was written down, such a folder had a database and no clock.json:
    `up --speed 10` on it was accepted though README said it was refused."""
    (tmp_path / "gpufleet.sqlite").write_bytes(b"")
    with pytest.raises(ClockMismatch, match="--speed 1;"):
        stack(tmp_path, 10.0).keep_clock()
    stack(tmp_path, 1.0).keep_clock()
    assert (tmp_path / "clock.json").exists()
