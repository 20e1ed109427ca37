"""A film beside shorts on real processes (seed 001, "Films need a whole machine"), and a
film whose machine dies mid-run resuming from its last checkpoint.

Two long episodes fill one local machine and two clips the other — the pool's ceiling is
two machines — then a film arrives: the machine whose jobs end soonest (the clips', by
their kinds' expected durations) drains, takes no new job, and the film runs there alone
as soon as the clips end, without waiting for the long episodes. A short that arrives
after the film never starts on the draining machine, and every short runs once to its end.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.provisioner.drivers.local_procs import group_members
from gpufleet.v1 import fleet_service_pb2, job_pb2, machine_pb2
from tests.e2e.fleet import Fleet, make_fleet

DONE = job_pb2.JOB_STATE_SUCCEEDED


def running_on(fleet: Fleet, job_id: str) -> str | None:
    job = fleet.get_job(job_id)
    if job.state not in (job_pb2.JOB_STATE_RUNNING, DONE) or not job.attempts:
        return None
    return job.attempts[-1].machine_id


def test_a_film_drains_the_machine_whose_shorts_end_first(fleet: Fleet) -> None:
    fleet.start_all()
    # Two long episodes (20 min each: still running when the film starts, about six minutes
    # in) on the first machine. What the drain reads is their kind's expected duration,
    # not this.
    longs = [fleet.submit(f"long-{i}", duration_s=1200).job_id for i in range(2)]
    long_machine = fleet.advance_until(
        lambda: (ms := {running_on(fleet, j) for j in longs}) != {None} and None not in ms and ms,
        max_virtual_s=900,
        what="the long episodes running",
    )
    assert len(long_machine) == 1, "two shorts pack onto one machine"
    # Two clips (3 min each) on the second.
    # (Another workspace: acme-studio's plan runs at most four jobs at once.)
    clips = [
        fleet.submit(f"clip-{i}", duration_s=180, kind="clip", workspace="indie-creator").job_id
        for i in range(2)
    ]
    clip_machine = fleet.advance_until(
        lambda: (ms := {running_on(fleet, j) for j in clips}) != {None} and None not in ms and ms,
        max_virtual_s=900,
        what="the clips running",
    )
    assert len(clip_machine) == 1 and clip_machine != long_machine
    (drained_id,) = clip_machine
    (long_id,) = long_machine

    film = fleet.submit("film-1", duration_s=600, kind="film").job_id
    drained = fleet.advance_until(
        lambda: (
            (
                m := fleet.fleet.GetMachine(
                    fleet_service_pb2.GetMachineRequest(machine_id=drained_id), timeout=10
                )
            ).state
            == machine_pb2.MACHINE_STATE_DRAINING
            and m
        ),
        step_s=1,
        max_virtual_s=60,
        what="the clips' machine draining",
    )
    assert drained.earmarked_for_job == film
    assert "its jobs end soonest" in drained.state_reason
    # A short that arrives after the film.
    late = fleet.submit("late-short", duration_s=60).job_id

    started = fleet.advance_until(
        lambda: running_on(fleet, film),
        max_virtual_s=900,
        what="the film running",
    )
    assert started == drained_id
    film_job = fleet.get_job(film)
    (attempt,) = film_job.attempts
    # It runs alone, on every slot of the machine, before the long episodes end.
    assert attempt.slot == 0
    assert all(fleet.get_job(j).state == job_pb2.JOB_STATE_RUNNING for j in longs)
    after = fleet.fleet.GetMachine(fleet_service_pb2.GetMachineRequest(machine_id=drained_id), timeout=10)
    assert after.state == machine_pb2.MACHINE_STATE_READY and not after.earmarked_for_job
    assert after.slots_busy == after.slots_total == 2

    for job_id in [*longs, *clips, late, film]:
        fleet.advance_until(
            lambda j=job_id: fleet.get_job(j).state == DONE, max_virtual_s=3600, what=f"{job_id} done"
        )
    # Every short ran once to its end; the late short never ran on the machine while it
    # drained or held the film.
    for job_id in [*longs, *clips, late]:
        (only,) = fleet.get_job(job_id).attempts
        assert only.state == job_pb2.ATTEMPT_STATE_SUCCEEDED
    with fleet.sessions() as s:
        late_attempt = s.execute(select(models.Attempt).where(models.Attempt.job_id == late)).scalar_one()
        film_attempt = s.execute(select(models.Attempt).where(models.Attempt.job_id == film)).scalar_one()
    assert late_attempt.machine_id == long_id or (
        film_attempt.ended_at is not None and late_attempt.started_at >= film_attempt.ended_at
    )
    # The film's charge counts every slot of its machine.
    assert film_attempt.slots == 2
    assert film_attempt.slot_seconds >= 2 * 600


@pytest.fixture
def checkpointing(pg_url: str) -> Iterator[Fleet]:
    root = Path(tempfile.mkdtemp(prefix="gfe2e-", dir="/tmp"))
    f = make_fleet(root, pg_url, checkpoint_every_s="10", checkpoint_dir=str(root / "checkpoints"))
    yield f
    f.close()


def crash(fleet: Fleet, machine_id: str) -> None:
    """The machine dies at once, as a host does: every process of its session is killed
    (the walled job with its runner: bubblewrap dies with its parent)."""
    record = json.loads((fleet.machines_root / machine_id / "instance.json").read_text())
    members = group_members(int(record["pgid"]))
    assert members, "the machine runs"
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_films_machine_lost_mid_run_resumes_from_its_last_checkpoint_uncharged(
    checkpointing: Fleet,
) -> None:
    fleet = checkpointing
    fleet.start_all()
    film = fleet.submit("film-ck", duration_s=600, kind="film").job_id
    first_machine = fleet.advance_until(
        lambda: running_on(fleet, film), max_virtual_s=900, what="the film running"
    )

    def kept() -> list[models.Checkpoint]:
        with fleet.sessions() as s:
            return list(
                s.execute(select(models.Checkpoint).where(models.Checkpoint.job_id == film)).scalars()
            )

    # Its progress reaches the control plane while it runs (at least 30 % rendered).
    fleet.advance_until(
        lambda: any(c.sequence >= 3 for c in kept()),
        step_s=5,
        max_virtual_s=900,
        what="three checkpoints kept",
    )
    crash(fleet, first_machine)
    last = max(kept(), key=lambda c: c.sequence)

    done = fleet.advance_until(
        lambda: (j := fleet.get_job(film)).state == DONE and j,
        step_s=3,
        max_virtual_s=3600,
        what="the film done on another machine",
    )
    lost, resumed = done.attempts
    assert lost.machine_id == first_machine and lost.state == job_pb2.ATTEMPT_STATE_LOST
    assert not lost.charged and lost.charge_micros == 0
    assert resumed.state == job_pb2.ATTEMPT_STATE_SUCCEEDED
    # The second attempt (on the cheapest machine the film could earmark: the sweeper saw
    # the dead one stopped, and it was started again) started from the newest checkpoint
    # the first attempt had sent.
    assert resumed.started_from.attempt_id == lost.attempt_id
    assert resumed.started_from.sequence == last.sequence
    assert done.charge_micros == resumed.charge_micros > 0, "the lost attempt costs nothing"
    # The platform gave it back — read from the control plane, checked by its digest —
    # and the job went on from there rather than from the beginning.
    disk = fleet.machines_root / resumed.machine_id / "disk"
    (folder,) = disk.glob(f"*/{resumed.attempt_id}")
    restored = (folder / "checkpoint.restore").read_bytes()
    assert hashlib.sha256(restored).hexdigest() == resumed.started_from.sha256 == last.sha256
    text = (folder / "job.log").read_text()
    assert "resuming from checkpoint" in text and "rendering: 10%" not in text
