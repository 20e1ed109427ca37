"""The seed's "easy to leave out" check, for every watchdog: a destroyed machine's record
is never re-armed, never sampled or probed, never marked, never refused one by one (it is
excluded by every scan's query), and never produces a provider call — however many of
the nets' triggers its stale fields still carry."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select

from gpufleet.common.db.models import Machine
from tests.integration.reaper.plane import NETS, running_plane


def _columns(row: Machine) -> dict[str, Any]:
    return {c.key: getattr(row, c.key) for c in Machine.__table__.columns}


def test_a_destroyed_row_is_invisible_to_every_net(pg_url: str) -> None:
    with running_plane(pg_url) as plane:
        now = plane.clock.now()
        dead: dict[str, Any] = dict(state="DESTROYED", intent="DESTROYED")
        baits = {
            # A quiet agent still answering: the idle scanner would arm it.
            "idle": plane.machine(**dead),
            # Both timers due: auto-stop and auto-destroy would call the provider.
            "timers": plane.machine(
                **dead, stop_due_at=now - timedelta(hours=1), destroy_due_at=now - timedelta(minutes=1)
            ),
            # Never contacted, deadline long past: provision deadline would destroy.
            "deadline": plane.machine(
                **dead, provision_deadline_at=now - timedelta(hours=1), first_observed_at=None
            ),
            # Never reported, start-up failure already sighted: boot failure would destroy.
            "boot": plane.machine(**dead, startup_failed_at=now - timedelta(minutes=5)),
            # Reported once, silent for an hour: went silent would destroy.
            "silent": plane.machine(**dead, worker_report_at=now - timedelta(hours=1)),
            # Probe failing while the provider lists it: the lost detector would mark it;
            # and one marked lost and reachable: it would unmark it.
            "unreachable": plane.machine(
                **dead,
                probe_ok_at=now - timedelta(hours=1),
                probe_failed_since=now - timedelta(minutes=30),
                provider_seen_at=now,
            ),
            "lost": plane.machine(**dead, lost=True, probe_ok_at=now - timedelta(minutes=1)),
            # Its last change long ago (stuck transition reads only transitional states).
            "old": plane.machine(**dead, state_changed_at=now - timedelta(days=3)),
            # A critical GPU finding, cordoned: the GPU-fault net would destroy.
            "gpu": plane.machine(
                **dead,
                cordoned=True,
                gpu_health="critical",
                gpu_findings=[{"kind": "xid", "severity": "critical", "gpu_index": 0, "code": 79}],
            ),
        }
        for mid in baits.values():
            plane.agents[mid].quiet()
            plane.agents[mid].startup_complete = False
        with plane.sessions() as s:
            before = {m.id: _columns(m) for m in s.execute(select(Machine)).scalars()}

        plane.tick()
        for _ in range(40):
            plane.step(60)

        with plane.sessions() as s:
            after = {m.id: _columns(m) for m in s.execute(select(Machine)).scalars()}
        assert after == before  # nothing re-armed, marked, sighted or moved
        for name, mid in baits.items():
            agent = plane.agents[mid]
            assert (agent.sample_calls, agent.probe_calls) == (0, 0), name
            assert plane.provider_ops(mid) == [], name
            assert plane.ledger(mid) == [], name
            assert plane.acted(mid) == {} and plane.refused(mid) == {}, name
        for net in NETS:
            stats = plane.stats(net)
            assert stats.runs >= 20, net
            assert (stats.actions, stats.refusals) == ({}, {}), net
