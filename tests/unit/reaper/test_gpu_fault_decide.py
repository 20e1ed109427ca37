"""The GPU-fault net's decision, from a table: a stored critical finding destroys the
machine through the ladder's gates that fit a broken GPU, and its own slot wait."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from gpufleet.reaper.gpu_fault import DestroyMachine, FaultedMachine, GpuFaultPolicy, decide, stored_findings
from gpufleet.reaper.refusal import RefusalReason, Refuse
from gpufleet.reaper.settings import Settings
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = GpuFaultPolicy(slot_release_wait=timedelta(minutes=2))


def finding(severity: str, kind: str = "xid", code: int = 79, gpu: int = 0) -> dict[str, Any]:
    return {"kind": kind, "severity": severity, "gpu_index": gpu, "code": code, "message": "m", "count": 1}


XID79 = finding("critical")
ECC_WARNING = finding("warning", kind="ecc_correctable", code=0)
FAULTED = FaultedMachine(replace(HEALTHY, worker_report_at=NOW), (XID79,), faulted_at=ago(seconds=30))

DESTROY = "destroy"
CASES: list[tuple[str, FaultedMachine, object]] = [
    ("a critical Xid on a ready machine", FAULTED, DESTROY),
    ("a critical finding among warnings", replace(FAULTED, findings=(ECC_WARNING, XID79)), DESTROY),
    ("warnings only: left alone", replace(FAULTED, findings=(ECC_WARNING,)), None),
    ("no findings (cordoned by an operator): left alone", replace(FAULTED, findings=()), None),
    # A stop would keep the broken GPU as warm capacity.
    (
        "stopped by the money chain: destroyed",
        replace(FAULTED, machine=replace(FAULTED.machine, state="STOPPED")),
        DESTROY,
    ),
    ("booting", replace(FAULTED, machine=replace(FAULTED.machine, state="BOOTING")), DESTROY),
    ("draining", replace(FAULTED, machine=replace(FAULTED.machine, state="DRAINING")), DESTROY),
    (
        "stopping: the stuck-transition net's until it lands",
        replace(FAULTED, machine=replace(FAULTED.machine, state="STOPPING")),
        None,
    ),
    ("destroying already", replace(FAULTED, machine=replace(FAULTED.machine, state="DESTROYING")), None),
    ("already destroyed", replace(FAULTED, machine=replace(FAULTED.machine, state="DESTROYED")), None),
    (
        "a registered box: cordoned, never destroyed",
        replace(FAULTED, machine=replace(FAULTED.machine, origin="REGISTERED")),
        Refuse(RefusalReason.NOT_OURS),
    ),
    (
        "not managed",
        replace(FAULTED, machine=replace(FAULTED.machine, managed=False)),
        Refuse(RefusalReason.NOT_OURS),
    ),
    (
        "a live attempt pins it (it ends through the ledger first)",
        replace(FAULTED, machine=replace(FAULTED.machine, live_attempts=1)),
        Refuse(RefusalReason.WORK_PINNED),
    ),
    (
        "not ours comes before pinned",
        replace(FAULTED, machine=replace(FAULTED.machine, origin="REGISTERED", live_attempts=1)),
        Refuse(RefusalReason.NOT_OURS),
    ),
    (
        "an ended attempt still holds a slot, within the wait",
        replace(FAULTED, held_slots=1, faulted_at=ago(minutes=1, seconds=59)),
        Refuse(RefusalReason.SLOT_HELD),
    ),
    (
        "a held slot past the wait: destroyed regardless",
        replace(FAULTED, held_slots=1, faulted_at=ago(minutes=2)),
        DESTROY,
    ),
    ("a held slot with no known start of the wait", replace(FAULTED, held_slots=1, faulted_at=None), DESTROY),
    # Gates of other nets that do not fit a broken GPU.
    (
        "an exempt class: the question is not whether it reports",
        replace(FAULTED, machine=replace(FAULTED.machine, workload_class="SILENT")),
        DESTROY,
    ),
    (
        "never observed running: no grace window to wait out",
        replace(FAULTED, machine=replace(FAULTED.machine, first_observed_at=None)),
        DESTROY,
    ),
    ("just observed", replace(FAULTED, machine=replace(FAULTED.machine, first_observed_at=NOW)), DESTROY),
    ("marked lost", replace(FAULTED, machine=replace(FAULTED.machine, lost=True)), DESTROY),
    ("held as warm capacity", replace(FAULTED, machine=replace(FAULTED.machine, warm_held=True)), DESTROY),
]


@pytest.mark.parametrize(("faulted", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(faulted: FaultedMachine, expected: object) -> None:
    decision = decide(NOW, faulted, POLICY)
    if expected == DESTROY:
        assert isinstance(decision, DestroyMachine) and decision.machine_id == faulted.machine.machine_id
    else:
        assert decision == expected


def test_the_destroy_says_what_failed_and_whether_it_waited_for_slots() -> None:
    quick = decide(NOW, FAULTED, POLICY)
    assert isinstance(quick, DestroyMachine) and quick.slots_free
    assert "xid 79 on GPU 0" in quick.details and "destroyed, not stopped" in quick.details
    late = decide(NOW, replace(FAULTED, held_slots=2, faulted_at=ago(minutes=3)), POLICY)
    assert isinstance(late, DestroyMachine) and not late.slots_free
    assert "2 ended attempt(s) still held a slot after 120s" in late.details


def test_a_wait_of_zero_never_waits_for_slots() -> None:
    assert isinstance(
        decide(NOW, replace(FAULTED, held_slots=1), GpuFaultPolicy(timedelta(0))), DestroyMachine
    )


def test_stored_findings_that_are_not_findings_are_skipped() -> None:
    assert stored_findings(None) == ()
    assert stored_findings({"kind": "xid"}) == ()
    assert stored_findings(["junk", XID79]) == (XID79,)


def test_the_settings_build_the_policy() -> None:
    settings = Settings(database_url="sqlite://", gpu_fault_slot_wait_s=30)
    assert settings.gpu_fault_policy() == GpuFaultPolicy(slot_release_wait=timedelta(seconds=30))
    assert Settings(database_url="sqlite://").gpu_fault_every_s == 60.0
