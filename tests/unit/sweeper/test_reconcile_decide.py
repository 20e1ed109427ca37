"""Inventory reconcile's decision, from tables: only intent-RUNNING machines of ours are
vouched for, only by a reachable provider that lists their instance as running."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpufleet.sweeper.inventory_reconcile import ListedInstance, ReconcileMachine, decide
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

M = ReconcileMachine(
    machine_id="m1",
    provider="SIM",
    provider_instance_id="i-1",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
)
RUNNING = ListedInstance(provider="SIM", provider_instance_id="i-1", machine_label="m1", status="RUNNING")

CASES: list[tuple[str, ReconcileMachine, list[ListedInstance], list[str], list[str]]] = [
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
    ("machine", "instances", "unreachable", "seen"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decide(
    machine: ReconcileMachine, instances: list[ListedInstance], unreachable: list[str], seen: list[str]
) -> None:
    assert decide([machine], instances, unreachable).seen == seen


def test_unreachable_and_not_reconciled_are_reported() -> None:
    stopped = replace(M, machine_id="m2", intent="STOPPED")
    decision = decide([M, stopped], [RUNNING], ["SIM"])
    assert decision.provider_unreachable == ["m1"]
    assert decision.not_reconciled == ["m2"]


def test_listed_instance_from_proto_reads_the_machine_label() -> None:
    inst = provisioner_service_pb2.Instance(
        provider=machine_pb2.PROVIDER_AWS,
        provider_instance_id="i-9",
        status=provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
        labels={"gpufleet-machine": "m9"},
    )
    assert ListedInstance.from_proto(inst) == ListedInstance("AWS", "i-9", "m9", "RUNNING")
