"""Inventory reconcile's decision, from tables: only intent-RUNNING machines of ours are
vouched for, only by a reachable provider that lists their instance as running; a
running machine whose instance the provider took back is a loss — a pre-emption when it
was spot — and nothing else ever is."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.common.db.enums import MachineState
from gpufleet.sweeper.inventory_reconcile import ReconcileMachine, decide
from gpufleet.sweeper.listing import ListedInstance
from gpufleet.sweeper.machine_loss import LossKind, classify_loss
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

LISTED_AT = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

M = ReconcileMachine(
    machine_id="m1",
    provider="SIM",
    provider_instance_id="i-1",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
    capacity_type="ON_DEMAND",
    state_changed_at=LISTED_AT - timedelta(hours=1),
)
SPOT = replace(M, capacity_type="SPOT")
RUNNING = ListedInstance(provider="SIM", provider_instance_id="i-1", machine_label="m1", status="RUNNING")

SEEN_CASES: list[tuple[str, ReconcileMachine, list[ListedInstance], list[str], list[str]]] = [
    ("listed running: seen", M, [RUNNING], [], ["m1"]),
    (
        "matched by label when our instance id is unknown",
        replace(M, provider_instance_id=None),
        [RUNNING],
        [],
        ["m1"],
    ),
    (
        "matched by label when the id differs",
        M,
        [replace(RUNNING, provider_instance_id="i-other")],
        [],
        ["m1"],
    ),
    (
        "neither id nor label matches",
        M,
        [replace(RUNNING, provider_instance_id="i-2", machine_label="m2")],
        [],
        [],
    ),
    ("same id at another provider is not ours", M, [replace(RUNNING, provider="AWS")], [], []),
    ("listed but stopped: not seen", M, [replace(RUNNING, status="STOPPED")], [], []),
    ("listed but pending: not seen", M, [replace(RUNNING, status="PENDING")], [], []),
    ("not listed: not seen", M, [], [], []),
    ("deliberately stopped: never touched", replace(M, intent="STOPPED", state="STOPPED"), [RUNNING], [], []),
    ("being destroyed: never touched", replace(M, intent="DESTROYED", state="DESTROYING"), [RUNNING], [], []),
    ("registered box: provider channel never written", replace(M, origin="REGISTERED"), [RUNNING], [], []),
    ("unmanaged: never touched", replace(M, managed=False), [RUNNING], [], []),
    ("destroyed: never touched", replace(M, state="DESTROYED"), [RUNNING], [], []),
    ("provider unreachable: no change", M, [RUNNING], ["SIM"], []),
    ("another provider unreachable: still seen", M, [RUNNING], ["AWS"], ["m1"]),
]


@pytest.mark.parametrize(
    ("machine", "instances", "unreachable", "seen"),
    [c[1:] for c in SEEN_CASES],
    ids=[c[0] for c in SEEN_CASES],
)
def test_seen(
    machine: ReconcileMachine, instances: list[ListedInstance], unreachable: list[str], seen: list[str]
) -> None:
    assert decide(LISTED_AT, [machine], instances, unreachable).seen == seen


# (case, machine, instances, unreachable, expected (kind, end state, provider status) or None)
LOSS_CASES: list[
    tuple[str, ReconcileMachine, list[ListedInstance], list[str], tuple[LossKind, MachineState, str] | None]
] = [
    (
        "spot stopped by the provider: spot_stopped, follows it to STOPPED",
        SPOT,
        [replace(RUNNING, status="STOPPED")],
        [],
        (LossKind.SPOT_STOPPED, MachineState.STOPPED, "STOPPED"),
    ),
    (
        "spot terminated: pre-empted, DESTROYED",
        SPOT,
        [replace(RUNNING, status="TERMINATED")],
        [],
        (LossKind.PREEMPTED, MachineState.DESTROYED, "TERMINATED"),
    ),
    (
        "spot gone from the list: pre-empted (to be confirmed), DESTROYED",
        SPOT,
        [],
        [],
        (LossKind.PREEMPTED, MachineState.DESTROYED, ""),
    ),
    (
        "spot found by label, stopped",
        replace(SPOT, provider_instance_id=None),
        [replace(RUNNING, status="STOPPED")],
        [],
        (LossKind.SPOT_STOPPED, MachineState.STOPPED, "STOPPED"),
    ),
    (
        "spot booting, stopped by the provider: pre-empted",
        replace(SPOT, state="BOOTING"),
        [replace(RUNNING, status="STOPPED")],
        [],
        (LossKind.SPOT_STOPPED, MachineState.STOPPED, "STOPPED"),
    ),
    (
        "spot draining, gone: pre-empted",
        replace(SPOT, state="DRAINING"),
        [],
        [],
        (LossKind.PREEMPTED, MachineState.DESTROYED, ""),
    ),
    (
        "on-demand gone from the list: vanished",
        M,
        [],
        [],
        (LossKind.VANISHED, MachineState.DESTROYED, ""),
    ),
    (
        "on-demand terminated: vanished",
        M,
        [replace(RUNNING, status="TERMINATED")],
        [],
        (LossKind.VANISHED, MachineState.DESTROYED, "TERMINATED"),
    ),
    (
        "on-demand stopped by someone else: lost, not a pre-emption",
        M,
        [replace(RUNNING, status="STOPPED")],
        [],
        (LossKind.STOPPED_OUTSIDE, MachineState.STOPPED, "STOPPED"),
    ),
    ("spot running: no loss", SPOT, [RUNNING], [], None),
    ("spot pending: not settled", SPOT, [replace(RUNNING, status="PENDING")], [], None),
    ("spot stopping: not settled yet", SPOT, [replace(RUNNING, status="STOPPING")], [], None),
    (
        "deliberate stop (intent STOPPED): never a pre-emption",
        replace(SPOT, intent="STOPPED", state="STOPPED"),
        [replace(RUNNING, status="STOPPED")],
        [],
        None,
    ),
    (
        "being stopped on purpose (intent STOPPED, STOPPING): never a pre-emption",
        replace(SPOT, intent="STOPPED", state="STOPPING"),
        [replace(RUNNING, status="STOPPED")],
        [],
        None,
    ),
    (
        "being destroyed on purpose: never a loss",
        replace(SPOT, intent="DESTROYED", state="DESTROYING"),
        [],
        [],
        None,
    ),
    ("registered box, gone: never touched", replace(SPOT, origin="REGISTERED"), [], [], None),
    ("unmanaged, gone: never touched", replace(SPOT, managed=False), [], [], None),
    ("already destroyed: never touched", replace(SPOT, state="DESTROYED"), [], [], None),
    ("provider unreachable: no conclusion", SPOT, [], ["SIM"], None),
    (
        "create in flight (PROVISIONING, no id yet): not a loss",
        replace(SPOT, state="PROVISIONING", provider_instance_id=None),
        [],
        [],
        None,
    ),
    (
        "start in flight (STARTING, still stopped at the provider): not a loss",
        replace(SPOT, state="STARTING"),
        [replace(RUNNING, status="STOPPED")],
        [],
        None,
    ),
    (
        "state changed after the list was read: not judged by it",
        replace(SPOT, state="BOOTING", state_changed_at=LISTED_AT + timedelta(seconds=1)),
        [replace(RUNNING, status="STOPPED")],
        [],
        None,
    ),
    (
        "another provider unreachable: still concluded",
        SPOT,
        [],
        ["AWS"],
        (LossKind.PREEMPTED, MachineState.DESTROYED, ""),
    ),
]


@pytest.mark.parametrize(
    ("machine", "instances", "unreachable", "expected"),
    [c[1:] for c in LOSS_CASES],
    ids=[c[0] for c in LOSS_CASES],
)
def test_losses(
    machine: ReconcileMachine,
    instances: list[ListedInstance],
    unreachable: list[str],
    expected: tuple[LossKind, MachineState, str] | None,
) -> None:
    decision = decide(LISTED_AT, [machine], instances, unreachable)
    got = [(x.kind, x.end_state, x.provider_status) for x in decision.losses]
    assert got == ([expected] if expected else [])
    if expected:
        [loss] = decision.losses
        # What the write re-checks: the state the scan saw, and when it last changed.
        assert (loss.state, loss.state_changed_at) == (machine.state, machine.state_changed_at)
        assert decision.seen == []


@pytest.mark.parametrize(
    ("capacity", "status", "expected"),
    [
        ("SPOT", "STOPPED", (LossKind.SPOT_STOPPED, MachineState.STOPPED)),
        ("SPOT", "TERMINATED", (LossKind.PREEMPTED, MachineState.DESTROYED)),
        ("SPOT", "", (LossKind.PREEMPTED, MachineState.DESTROYED)),
        ("ON_DEMAND", "STOPPED", (LossKind.STOPPED_OUTSIDE, MachineState.STOPPED)),
        ("ON_DEMAND", "", (LossKind.VANISHED, MachineState.DESTROYED)),
        ("SPOT", "RUNNING", None),
        ("SPOT", "PENDING", None),
        ("ON_DEMAND", "STOPPING", None),
    ],
)
def test_classify_loss(capacity: str, status: str, expected: tuple[LossKind, MachineState] | None) -> None:
    assert classify_loss(capacity, status) == expected


def test_unreachable_not_reconciled_and_unsettled_are_reported() -> None:
    stopped = replace(M, machine_id="m2", intent="STOPPED")
    aws = replace(M, machine_id="m3", provider="AWS", provider_instance_id="i-3")
    decision = decide(LISTED_AT, [M, stopped, aws], [RUNNING], ["SIM"])
    assert decision.provider_unreachable == ["m1"]
    assert decision.not_reconciled == ["m2"]
    assert decision.losses[0].machine_id == "m3"
    pending = decide(LISTED_AT, [SPOT], [replace(RUNNING, status="PENDING")], [])
    assert (pending.unsettled, pending.losses) == (["m1"], [])


def test_listed_instance_from_proto_reads_labels_and_launch_time() -> None:
    inst = provisioner_service_pb2.Instance(
        provider=machine_pb2.PROVIDER_AWS,
        provider_instance_id="i-9",
        status=provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
        labels={"gpufleet-machine": "m9", "gpufleet-deployment": "prod"},
        capacity_type=machine_pb2.CAPACITY_TYPE_SPOT,
        zone="us-east-1a",
    )
    inst.launch_time.FromDatetime(LISTED_AT)
    listed = ListedInstance.from_proto(inst)
    assert (listed.provider, listed.provider_instance_id, listed.machine_label, listed.status) == (
        "AWS",
        "i-9",
        "m9",
        "RUNNING",
    )
    assert (listed.deployment_label, listed.launch_time, listed.capacity_type, listed.zone) == (
        "prod",
        LISTED_AT,
        "SPOT",
        "us-east-1a",
    )
    unlabelled = ListedInstance.from_proto(provisioner_service_pb2.Instance(provider_instance_id="x"))
    assert (unlabelled.machine_label, unlabelled.deployment_label, unlabelled.launch_time) == (
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    ("capacity", "status", "expected"),
    [
        # The machine halted itself (its dead-man switch): never a pre-emption, spot or not.
        ("SPOT", "STOPPED", (LossKind.STOPPED_ITSELF, MachineState.STOPPED)),
        ("ON_DEMAND", "STOPPED", (LossKind.STOPPED_ITSELF, MachineState.STOPPED)),
        # Gone is gone: a terminated or unlisted instance is not a self-stop, whatever it says.
        ("SPOT", "TERMINATED", (LossKind.PREEMPTED, MachineState.DESTROYED)),
        ("ON_DEMAND", "", (LossKind.VANISHED, MachineState.DESTROYED)),
        ("SPOT", "RUNNING", None),
    ],
)
def test_a_machine_that_stopped_itself_is_recorded_as_such(
    capacity: str, status: str, expected: tuple[LossKind, MachineState] | None
) -> None:
    assert classify_loss(capacity, status, stopped_by_itself=True) == expected


def test_a_self_stop_lands_in_the_ledger_as_its_own_class() -> None:
    from gpufleet.common.ledger import ROUTES, FailureClass, LedgerOutcome
    from gpufleet.sweeper.machine_loss import MachineLoss

    loss = MachineLoss(
        machine_id="m-1",
        kind=LossKind.STOPPED_ITSELF,
        end_state=MachineState.STOPPED,
        provider_status="STOPPED",
        state="READY",
        state_changed_at=None,
    )
    assert loss.failure_class is FailureClass.MACHINE_STOPPED_ITSELF
    assert ROUTES[FailureClass.MACHINE_STOPPED_ITSELF] is LedgerOutcome.REPLACE_MACHINE


STOPPED_SPOT = replace(SPOT, state="STOPPED", intent="STOPPED")


@pytest.mark.parametrize(
    ("name", "machine", "listed", "restarted"),
    [
        ("a stopped spot machine listed running: restarted by the provider", STOPPED_SPOT, "RUNNING", True),
        ("still stopped: nothing", STOPPED_SPOT, "STOPPED", False),
        (
            "on demand, listed running: not this rule's",
            replace(STOPPED_SPOT, capacity_type="ON_DEMAND"),
            "RUNNING",
            False,
        ),
        (
            "meant to be destroyed: not this rule's",
            replace(STOPPED_SPOT, intent="DESTROYED"),
            "RUNNING",
            False,
        ),
        ("not ours to manage", replace(STOPPED_SPOT, managed=False), "RUNNING", False),
        (
            "stopped after the list was read: not judged by it",
            replace(STOPPED_SPOT, state_changed_at=LISTED_AT + timedelta(seconds=1)),
            "RUNNING",
            False,
        ),
    ],
)
def test_a_spot_machine_the_provider_runs_again(
    name: str, machine: ReconcileMachine, listed: str, restarted: bool
) -> None:
    decision = decide(LISTED_AT, [machine], [replace(RUNNING, status=listed)], [])
    assert [r.machine_id for r in decision.restarted] == (["m1"] if restarted else [])
    assert decision.not_reconciled == ([] if restarted else ["m1"])
    assert decision.losses == [] and decision.seen == []


def test_a_machine_never_listed_within_the_grace_is_not_yet_listed() -> None:
    young = replace(M, state="BOOTING", requested_at=LISTED_AT - timedelta(minutes=2))
    grace = timedelta(minutes=10)
    assert decide(LISTED_AT, [young], [], [], grace).not_yet_listed == ["m1"]
    # Listed once before, or past the grace: its absence is a loss as always.
    seen_before = replace(young, provider_seen_at=LISTED_AT - timedelta(minutes=1))
    assert [x.machine_id for x in decide(LISTED_AT, [seen_before], [], [], grace).losses] == ["m1"]
    old = replace(young, requested_at=LISTED_AT - grace)
    assert [x.machine_id for x in decide(LISTED_AT, [old], [], [], grace).losses] == ["m1"]
