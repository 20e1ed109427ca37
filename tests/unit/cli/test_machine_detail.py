"""`gpufleet machines ID`: one machine's detail view says who changed its state last, and why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.cli.machines import machine_detail
from gpufleet.v1 import machine_pb2

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def at(when: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(when)
    return out


def lines(m: machine_pb2.Machine) -> list[str]:
    # The values are aligned; compare each line with its spacing collapsed.
    return [" ".join(line.split()) for line in machine_detail(m, NOW).splitlines()]


def test_the_detail_names_the_actor_and_the_reason() -> None:
    m = machine_pb2.Machine(
        machine_id="0b7c1e2a-0000-4000-8000-000000000001",
        pool="l4",
        offering=machine_pb2.Offering(offering_id="gcp-l4-spot"),
        state=machine_pb2.MACHINE_STATE_DESTROYING,
        intent=machine_pb2.MACHINE_INTENT_DESTROYED,
        state_changed_at=at(NOW - timedelta(minutes=3)),
        state_changed_by="reaper",
        state_reason="went_silent: no report for 10m",
        slots_total=2,
    )
    shown = lines(m)
    assert "state DESTROYING, intent DESTROYED" in shown
    assert "changed 3m ago by reaper: went_silent: no report for 10m" in shown


def test_a_row_from_before_the_actor_was_recorded_says_so() -> None:
    m = machine_pb2.Machine(machine_id="m", state=machine_pb2.MACHINE_STATE_READY)
    assert "changed - by ?" in lines(m)
