"""Each one-step net's due predicate, in its two forms, selects the same machines.

The SQL form (the scan's WHERE, shaped for its index) and the Python form (``decide``'s
first check, and what the simulator decides on) sit side by side in each net's module
(gpufleet.reaper.net_runner says why they are not generated from one). Here both run over
one table of machines on each store: every timer and report clock before, at and after
its threshold, every state, contact and no contact, this life and the last. A rule
changed in one form and not the other fails here. Each net's ``due_at`` (when a machine
falls due if nothing changes: the simulator wakes the net then) agrees with both. So does
the stuck-transition net's finish guard, which the simulator applies a re-issue's answer by.
"""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Machine
from gpufleet.reaper import auto_destroy, auto_stop, provision_deadline, stuck_transition, went_silent
from gpufleet.reaper.net_runner import OneStepSpec
from gpufleet.reaper.settings import Settings
from gpufleet.reaper.snapshot import scan
from tests.support.fleet_rows import add_machine

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)
SETTINGS = Settings()
POLICIES: dict[str, Any] = {
    auto_stop.NAME: SETTINGS.auto_stop_policy(),
    auto_destroy.NAME: SETTINGS.auto_destroy_policy(),
    provision_deadline.NAME: SETTINGS.provision_deadline_policy(),
    went_silent.NAME: SETTINGS.went_silent_policy(),
}
SPECS: tuple[OneStepSpec[Any, Any], ...] = (
    auto_stop.SPEC,
    auto_destroy.SPEC,
    provision_deadline.SPEC,
    went_silent.SPEC,
)


def _around(at: datetime) -> list[datetime]:
    return [at - S, at, at + S]


def _rows() -> list[dict[str, Any]]:
    silent = SETTINGS.went_silent_policy().silent_after
    default_deadline = SETTINGS.provision_deadline_policy().default_deadline
    first_seen = NOW - timedelta(hours=1)
    choices: dict[str, list[Any]] = {
        "state": ["PROVISIONING", "BOOTING", "READY", "DRAINING", "STOPPING", "STOPPED", "DESTROYING"],
        "stop_due_at": [None, *_around(NOW)],
        "destroy_due_at": [None, *_around(NOW)],
        "first_observed_at": [None, first_seen],
        # Around the silence threshold, and one from before this life's first sighting.
        "worker_report_at": [None, *_around(NOW - silent), first_seen - S, NOW],
        "probe_ok_at": [None, NOW - timedelta(minutes=1)],
        "provision_deadline_at": [None, *_around(NOW)],
        "requested_at": _around(NOW - default_deadline),
        # A STOPPED machine with no destroy timer falls due its gap after it stopped.
        "state_changed_at": [
            NOW - timedelta(minutes=1),
            *_around(NOW - SETTINGS.auto_destroy_policy().stopped_for),
        ],
    }
    rng = random.Random(26)
    keys = list(choices)
    everything = list(itertools.product(*(choices[k] for k in keys)))
    # A seeded sample of the combinations (the same table on every run).
    picked = rng.sample(everything, 600)
    return [dict(zip(keys, combo, strict=True)) for combo in picked]


def test_the_scan_and_the_decision_agree_on_what_is_due(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        sessions = make_sessionmaker(engine)
        for values in _rows():
            add_machine(sessions, NOW, **values)
        for spec in SPECS:
            _agree(sessions, spec)
    finally:
        engine.dispose()


def _agree(sessions: sessionmaker[Session], spec: OneStepSpec[Any, Any]) -> None:
    policy = POLICIES[spec.name]
    with sessions() as session:
        selected = {m.machine_id for m in scan(session, spec.due(NOW, policy))}
        everything = scan(session, [])
    judged = {m.machine_id for m in everything if spec.is_due(NOW, m, policy)}
    assert selected == judged, spec.name
    # The table exercises both sides of the predicate.
    assert 0 < len(selected) < len(everything), spec.name
    # And decide, given a machine that is not due, does nothing with it.
    for m in everything:
        if m.machine_id not in judged:
            assert spec.decide(NOW, m, policy) is None, (spec.name, m)
    # Its requeue-after (``due_at``) is the first instant the scan selects it, nothing changing:
    # not a microsecond before, and from then on; None for one the scan never selects.
    tick = timedelta(microseconds=1)
    for m in everything:
        at = spec.due_at(m, policy)
        if at is None:
            assert not spec.is_due(NOW + timedelta(days=365), m, policy), (spec.name, m)
            continue
        assert not spec.is_due(at - tick, m, policy) and spec.is_due(at, m, policy), (spec.name, m)
    at_later = {m.machine_id for m in everything if (a := spec.due_at(m, policy)) is not None and a <= NOW}
    assert at_later == selected, spec.name


def test_a_finish_writes_where_the_simulator_finishes(db_url: str) -> None:
    """The stuck-transition net's finish guard, in SQL (``finish_where`` beside the state it
    moves from, as ``lifecycle.transition`` writes it) and over a snapshot
    (``finish_holds``, what the simulator applies a re-issue's answer by), holds for the
    same rows: every row of a table against every transition read from it."""
    engine = make_engine(db_url)
    began = [NOW - timedelta(minutes=20), NOW - timedelta(minutes=20) + S, NOW]
    try:
        sessions = make_sessionmaker(engine)
        for state, intent, changed, origin, managed in itertools.product(
            ["STOPPING", "DESTROYING", "STOPPED"],  # (a DESTROYED row is read by no scan)
            ["STOPPED", "DESTROYED"],
            began,
            ["PROVISIONED", "REGISTERED"],
            [True, False],
        ):
            add_machine(
                sessions,
                NOW,
                state=state,
                intent=intent,
                state_changed_at=changed,
                origin=origin,
                managed=managed,
            )
        with sessions() as session:
            rows = scan(session, [])
        reads = [r for r in rows if r.state in ("STOPPING", "DESTROYING")]
        held = 0
        for read in reads:
            with sessions() as session:
                where = [Machine.state == read.state, *stuck_transition.finish_where(read)]
                in_sql = {m.machine_id for m in scan(session, where)}
            in_python = {r.machine_id for r in rows if stuck_transition.finish_holds(read, r)}
            assert in_sql == in_python, read
            held += len(in_sql)
        # Both sides exercised: a read's own row holds when it is ours, and most rows do not.
        assert 0 < held < len(reads) * len(rows)
    finally:
        engine.dispose()
