"""The orphan sweep against the real ProvisionerService and its sim cloud (one account
shared with another deployment): what it destroys, when, and what it never touches."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from gpufleet.common.db.models import LeaderLease as LeaseRow
from gpufleet.common.db.models import ProviderListing, WatchdogStat
from gpufleet.common.errors import Fenced
from gpufleet.common.provider_errors import Transient
from gpufleet.provisioner.drivers.base import InstanceSpec
from tests.integration.sweeper.conftest import Sweep
from tests.support.fleet_rows import add_machine, machine
from tests.support.sim_provisioner import SIM_OFFERING, SimProvisioner

FIVE_MIN = 300.0


def destroyed_at_sim(sim: SimProvisioner) -> list[str]:
    return [c.machine_id for c in sim.cloud.calls_of("destroy")]


def test_an_orphan_is_destroyed_only_after_its_grace_window_counted_from_both_clocks(
    sim_sweep: Sweep,
) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    sim.create("m-old")  # launched two hours before any sweep saw it
    sweep.clock.advance(timedelta(hours=2))
    t1 = sweep.clock.now()
    sweep.tick()
    old = sweep.orphan_rows()["m-old"]
    assert (old.action, old.first_seen_at, old.launch_time) == ("WAITING", t1, t1 - timedelta(hours=2))

    sweep.clock.advance(timedelta(minutes=2))
    sim.create("m-new")  # launched between two sweeps
    launched = sweep.clock.now()
    sweep.step(FIVE_MIN - 120)  # t1 + 5 min: the first sweep that sees it
    new = sweep.orphan_rows()["m-new"]
    assert (new.action, new.first_seen_at, new.launch_time) == (
        "WAITING",
        t1 + timedelta(minutes=5),
        launched,
    )

    for _ in range(4):  # up to t1 + 25 min: both wait
        sweep.step(FIVE_MIN)
    assert sim.instance("m-old") is not None and sim.instance("m-new") is not None
    assert sweep.failures() == [] and destroyed_at_sim(sim) == []

    sweep.step(FIVE_MIN)  # t1 + 30: the old one's first sighting is 30 min old; the new one is 28 min old
    assert sim.instance("m-old") is None
    assert sim.instance("m-new") is not None
    assert destroyed_at_sim(sim) == ["m-old"]
    [found] = sweep.failures()
    assert (found.failure_class, found.machine_id, found.detector, found.outcome) == (
        "orphan_found",
        "m-old",
        "orphan_sweep",
        "NOTHING",
    )
    old = sweep.orphan_rows()["m-old"]
    assert (old.action, old.destroyed_at) == ("DESTROYED", t1 + timedelta(minutes=30))

    sweep.step(FIVE_MIN)  # t1 + 35: 33 min after launch, 30 after the first sighting
    assert sim.instance("m-new") is None
    assert destroyed_at_sim(sim) == ["m-old", "m-new"]
    assert [f.machine_id for f in sweep.failures("orphan_found")] == ["m-old", "m-new"]
    assert {k: r.action for k, r in sweep.orphan_rows().items()} == {
        "m-old": "DESTROYED",
        "m-new": "DESTROYED",
    }
    last = sweep.sweep_rows("ORPHAN_SWEEP")[-1]
    assert (last.orphans_seen, last.orphans_destroyed) == (1, 1)
    sweep.step(FIVE_MIN)  # gone: nothing more happens
    assert destroyed_at_sim(sim) == ["m-old", "m-new"] and len(sweep.failures()) == 2


def test_a_foreign_instance_and_an_in_flight_create_survive_every_sweep(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    now = sweep.clock.now()
    # Another deployment's instance in the same account (labelled gpufleet-deployment=other).
    sim.cloud.driver("other").create(InstanceSpec(machine_id="m-theirs", offering=SIM_OFFERING))
    # A create whose answer has not come back: the row is PROVISIONING with no provider id.
    inflight = add_machine(
        sweep.sessions,
        now,
        id="m-inflight",
        state="PROVISIONING",
        provider_instance_id=None,
        first_observed_at=None,
    )
    sim.create(inflight)
    ours = add_machine(
        sweep.sessions, now, id="m-ours", provider_instance_id=sim.create("m-ours").provider_instance_id
    )
    sim.create("m-orphan")  # and one real orphan, so the sweep is seen to act
    sweep.tick()
    for _ in range(36):  # three hours of sweeps
        sweep.step(FIVE_MIN)
    assert destroyed_at_sim(sim) == ["m-orphan"]
    survivors = {i.machine_id for i in sim.cloud.all_instances()}
    assert survivors == {"m-theirs", "m-inflight", "m-ours"}
    assert list(sweep.orphan_rows()) == ["m-orphan"]
    assert machine(sweep.sessions, inflight).state == "PROVISIONING"
    assert machine(sweep.sessions, ours).state == "READY"
    # The provisioner never even listed the foreign instance to us.
    # Ours: in flight, running, and the orphan until it went.
    assert [r.instances_seen for r in sweep.sweep_rows("ORPHAN_SWEEP")] == [3] * 7 + [2] * 30


def test_an_instance_without_our_deployment_label_in_the_list_is_refused(sweep: Sweep) -> None:
    """The provisioner filters by our label; should a list ever carry another's instance,
    the sweep refuses it anyway and says so."""
    sweep.provisioner.list_instance("m-unlabelled", "i-foreign", label=False)
    sweep.tick()
    sweep.step(2 * 60 * 60)
    assert sweep.provisioner.ops("destroy") == []
    assert sweep.orphan_rows() == {}
    assert sweep.failures() == []
    with sweep.sessions() as s:
        stats = s.get_one(WatchdogStat, "orphan_sweep")
    assert stats.refusals.get("FOREIGN_INSTANCE") == 2


def test_an_unreachable_provider_means_no_action_and_an_incident_after_three_rounds(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    sim.create("m-orphan")
    sweep.run_orphan_sweep()
    sweep.clock.advance(timedelta(minutes=31))  # past its grace window
    sim.cloud.fail_next("list", Transient("compute API unavailable"), times=3)
    for rounds in (1, 2):
        sweep.run_orphan_sweep()
        assert sim.instance("m-orphan") is not None
        assert sweep.orphan_rows()["m-orphan"].action == "WAITING"
        assert sweep.incidents() == []
        assert sweep.sweep_rows("ORPHAN_SWEEP")[-1].unreachable == ["SIM"]
        with sweep.sessions() as s:
            assert s.get_one(ProviderListing, "SIM").failed_rounds == rounds
        sweep.clock.advance(timedelta(minutes=5))
    sweep.run_orphan_sweep()
    assert sim.instance("m-orphan") is not None
    [incident] = sweep.incidents()
    assert (incident.failure_class, incident.state) == ("provider_call_failed", "OPEN")
    assert "SIM could not be listed for 3 orphan sweeps in a row" in incident.summary
    [ledger] = sweep.failures()
    assert (ledger.failure_class, ledger.detector) == ("provider_call_failed", "orphan_sweep")

    sweep.clock.advance(timedelta(minutes=5))
    sweep.run_orphan_sweep()  # listed again: the orphan goes, the streak ends, no second incident
    assert sim.instance("m-orphan") is None
    assert len(sweep.incidents()) == 1
    with sweep.sessions() as s:
        listing = s.get_one(ProviderListing, "SIM")
        assert (listing.failed_rounds, listing.failing_since, listing.last_listed_at) == (
            0,
            None,
            sweep.clock.now(),
        )


def test_a_provisioner_that_cannot_be_reached_opens_an_incident_after_three_rounds(sweep: Sweep) -> None:
    sweep.provisioner.fail_next("list", "TRANSIENT", times=4)
    for _ in range(4):
        sweep.run_orphan_sweep()
        sweep.clock.advance(timedelta(minutes=5))
    [incident] = sweep.incidents()
    assert "the provisioner could not be reached for 3 orphan sweeps in a row" in incident.summary
    assert all("no action this round" in r.summary for r in sweep.sweep_rows("ORPHAN_SWEEP"))
    with sweep.sessions() as s:
        assert s.execute(select(ProviderListing.failed_rounds)).scalars().all() == [4]


def test_a_failed_destroy_keeps_its_intent_alerts_and_is_tried_again(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    sim.create("m-orphan")
    sweep.run_orphan_sweep()
    sweep.clock.advance(timedelta(minutes=30))
    sim.cloud.fail_next("destroy", Transient("throttled"))
    sweep.run_orphan_sweep()
    assert sim.instance("m-orphan") is not None
    assert sweep.orphan_rows()["m-orphan"].action == "DESTROYING"
    assert [f.failure_class for f in sweep.failures()] == ["orphan_found", "provider_call_failed"]
    assert len(sweep.incidents()) == 1
    sweep.clock.advance(timedelta(minutes=5))
    sweep.run_orphan_sweep()
    assert sim.instance("m-orphan") is None
    assert sweep.orphan_rows()["m-orphan"].action == "DESTROYED"
    # Found once; the retry adds no second ledger row.
    assert [f.failure_class for f in sweep.failures()] == ["orphan_found", "provider_call_failed"]


def test_an_orphan_that_goes_away_by_itself_is_marked_gone(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    instance = sim.create("m-orphan")
    sweep.run_orphan_sweep()
    sim.cloud.preempt(instance.provider_instance_id)
    sweep.clock.advance(timedelta(minutes=5))
    sweep.run_orphan_sweep()
    row = sweep.orphan_rows()["m-orphan"]
    assert (row.action, row.destroyed_at) == ("GONE", None)
    assert destroyed_at_sim(sim) == [] and sweep.failures() == []


def test_only_the_leader_sweeps(sim_sweep: Sweep) -> None:
    """Every write is fenced: a replica whose lease moved on writes nothing."""
    sweep, sim = sim_sweep, sim_sweep.provisioner
    sim.create("m-orphan")
    sweep.run_orphan_sweep()
    sweep.clock.advance(timedelta(minutes=31))
    with sweep.sessions() as s, s.begin():
        s.get_one(LeaseRow, "sweeper").epoch += 1  # another replica took over
    with pytest.raises(Fenced):
        sweep.orphans.run(sweep.clock.now(), sweep.lease)
    assert sim.instance("m-orphan") is not None
    assert sweep.orphan_rows()["m-orphan"].action == "WAITING"
