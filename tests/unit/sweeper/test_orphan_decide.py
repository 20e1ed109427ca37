"""The orphan sweep's decision, from tables: an instance labelled with our deployment and
recorded nowhere here is destroyed only once older than the grace window by both the
provider's launch time and the first sweep that saw it; everything else is left alone."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.sweeper.listing import ListedInstance
from gpufleet.sweeper.orphan_rows import OrphanAction
from gpufleet.sweeper.orphan_sweep import (
    Inventory,
    OrphanPolicy,
    TrackedOrphan,
    decide,
    past_grace,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(minutes=30)
POLICY = OrphanPolicy(deployment_id="prod", grace=GRACE)
EMPTY = Inventory(machine_ids=frozenset(), instance_keys=frozenset())

ORPHAN = ListedInstance(
    provider="AWS",
    provider_instance_id="i-orphan",
    machine_label="m-orphan",
    status="RUNNING",
    deployment_label="prod",
    launch_time=NOW - timedelta(hours=3),
    zone="us-east-1a",
)
KEY = ("AWS", "i-orphan")


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def tracked(
    first_seen_min_ago: float, action: OrphanAction = OrphanAction.WAITING
) -> dict[tuple[str, str], TrackedOrphan]:
    return {KEY: TrackedOrphan(first_seen_at=ago(first_seen_min_ago), action=action.value)}


# (case, instance, inventory, tracked rows, expected action or None when not an orphan, newly found)
CASES: list[
    tuple[str, ListedInstance, Inventory, dict[tuple[str, str], TrackedOrphan], OrphanAction | None, bool]
] = [
    ("an old instance first seen now still waits", ORPHAN, EMPTY, {}, OrphanAction.WAITING, False),
    (
        "an old instance seen 29 minutes ago still waits",
        ORPHAN,
        EMPTY,
        tracked(29),
        OrphanAction.WAITING,
        False,
    ),
    (
        "an old instance first seen 30 minutes ago goes",
        ORPHAN,
        EMPTY,
        tracked(30),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "a new instance seen for an hour by our clock but launched 10 minutes ago waits",
        replace(ORPHAN, launch_time=ago(10)),
        EMPTY,
        tracked(60),
        OrphanAction.WAITING,
        False,
    ),
    (
        "a new instance goes 30 minutes after its launch",
        replace(ORPHAN, launch_time=ago(30)),
        EMPTY,
        tracked(30),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "an unknown launch time counts as the first sighting",
        replace(ORPHAN, launch_time=None),
        EMPTY,
        tracked(30),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "a destroy that failed is tried again without a second ledger row",
        ORPHAN,
        EMPTY,
        tracked(45, OrphanAction.DESTROYING),
        OrphanAction.DESTROYING,
        False,
    ),
    (
        "destroyed yet listed again: destroyed again, found again",
        ORPHAN,
        EMPTY,
        tracked(45, OrphanAction.DESTROYED),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "gone and back: its first sighting still counts",
        ORPHAN,
        EMPTY,
        tracked(45, OrphanAction.GONE),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "matched to a record until now: the grace window starts again",
        ORPHAN,
        EMPTY,
        tracked(600, OrphanAction.RECORDED),
        OrphanAction.WAITING,
        False,
    ),
    (
        "no machine label: only a human can remove it",
        replace(ORPHAN, machine_label=None),
        EMPTY,
        tracked(30),
        OrphanAction.NEEDS_HUMAN,
        True,
    ),
    (
        "stopped orphans cost disk: they go too",
        replace(ORPHAN, status="STOPPED"),
        EMPTY,
        tracked(30),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "matched by its machine label (a create still in flight, no provider id yet)",
        ORPHAN,
        Inventory(machine_ids=frozenset({"m-orphan"}), instance_keys=frozenset()),
        {},
        None,
        False,
    ),
    (
        "matched by provider and instance id",
        replace(ORPHAN, machine_label="m-relabelled"),
        Inventory(machine_ids=frozenset(), instance_keys=frozenset({KEY})),
        {},
        None,
        False,
    ),
    (
        "the same instance id at another provider is not a match",
        ORPHAN,
        Inventory(machine_ids=frozenset(), instance_keys=frozenset({("GCP", "i-orphan")})),
        tracked(30),
        OrphanAction.DESTROYING,
        True,
    ),
    (
        "another deployment's instance: never touched",
        replace(ORPHAN, deployment_label="staging"),
        EMPTY,
        tracked(99),
        None,
        False,
    ),
    (
        "no deployment label: never touched",
        replace(ORPHAN, deployment_label=None),
        EMPTY,
        tracked(99),
        None,
        False,
    ),
    ("terminated: already gone", replace(ORPHAN, status="TERMINATED"), EMPTY, tracked(99), None, False),
]


@pytest.mark.parametrize(
    ("instance", "inventory", "rows", "action", "newly_found"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_decide(
    instance: ListedInstance,
    inventory: Inventory,
    rows: dict[tuple[str, str], TrackedOrphan],
    action: OrphanAction | None,
    newly_found: bool,
) -> None:
    decision = decide(NOW, [instance], [], inventory, rows, POLICY)
    got = [(v.action, v.newly_found) for v in decision.orphans]
    assert got == ([(action, newly_found)] if action else [])


def test_first_sighting_is_now_for_a_new_orphan_and_kept_for_a_tracked_one() -> None:
    [new] = decide(NOW, [ORPHAN], [], EMPTY, {}, POLICY).orphans
    assert (new.first_seen_at, new.new) == (NOW, True)
    [old] = decide(NOW, [ORPHAN], [], EMPTY, tracked(12), POLICY).orphans
    assert (old.first_seen_at, old.new) == (ago(12), False)


def test_foreign_instances_are_reported_never_acted_on() -> None:
    foreign = replace(ORPHAN, deployment_label="staging", provider_instance_id="i-theirs")
    decision = decide(NOW, [foreign, ORPHAN], [], EMPTY, {}, POLICY)
    assert decision.foreign == [foreign]
    assert [v.instance for v in decision.orphans] == [ORPHAN]


@pytest.mark.parametrize(
    ("action", "unreachable", "settled"),
    [
        (OrphanAction.WAITING, [], OrphanAction.GONE),
        (OrphanAction.NEEDS_HUMAN, [], OrphanAction.GONE),
        (OrphanAction.DESTROYING, [], OrphanAction.DESTROYED),
        # Absence from a list that could not be read proves nothing.
        (OrphanAction.WAITING, ["AWS"], None),
        (OrphanAction.DESTROYING, ["AWS"], None),
        (OrphanAction.DESTROYED, [], None),
        (OrphanAction.GONE, [], None),
    ],
)
def test_tracked_rows_no_longer_listed(
    action: OrphanAction, unreachable: list[str], settled: OrphanAction | None
) -> None:
    decision = decide(NOW, [], unreachable, EMPTY, tracked(10, action), POLICY)
    assert decision.settled == ([(KEY, settled)] if settled else [])


def test_a_tracked_orphan_that_a_record_now_matches_is_settled_as_recorded() -> None:
    inventory = Inventory(machine_ids=frozenset({"m-orphan"}), instance_keys=frozenset())
    decision = decide(NOW, [ORPHAN], [], inventory, tracked(10), POLICY)
    assert (decision.orphans, decision.settled) == ([], [(KEY, OrphanAction.RECORDED)])


@pytest.mark.parametrize(
    ("first_seen", "launched", "expected"),
    [
        (ago(30), ago(30), True),
        (ago(29), ago(300), False),
        (ago(300), ago(29), False),
        (ago(31), None, True),
        (ago(29), None, False),
        (ago(60), NOW + timedelta(minutes=5), False),  # a launch time ahead of our clock waits
    ],
)
def test_past_grace_needs_both_clocks(
    first_seen: datetime, launched: datetime | None, expected: bool
) -> None:
    assert past_grace(NOW, first_seen, launched, GRACE) is expected
