"""What a routed outcome does, written out by hand: the one decision (``decide_effect``)
that the ledger's SQL applier and the simulator both apply."""

from __future__ import annotations

from datetime import timedelta

from gpufleet.common.db.enums import LedgerOutcome, QuarantineKind
from gpufleet.common.ledger import (
    FailureClass,
    LedgerEffect,
    OutcomeTarget,
    QuarantineEffect,
    decide_effect,
    route,
)
from gpufleet.common.outcome_policy import OutcomePolicy

POLICY = OutcomePolicy(offering_quarantine_ttl=timedelta(minutes=30), halt_ttl=None)
TARGET = OutcomeTarget("gcp-usc1-a-l4", "gcp", "us-central1")


def effect(cls: FailureClass, target: OutcomeTarget = TARGET, on_machine: bool = True) -> LedgerEffect:
    return decide_effect(cls.value, route(cls), POLICY, target, on_machine=on_machine)


def test_a_stockout_quarantines_its_offering_for_the_ttl() -> None:
    assert effect(FailureClass.STOCKOUT) == LedgerEffect(
        LedgerOutcome.STOP_HARDWARE_CONFIG,
        quarantine=QuarantineEffect(
            QuarantineKind.OFFERING, timedelta(minutes=30), offering_id="gcp-usc1-a-l4"
        ),
        incident=True,  # a stockout also tells a human (INCIDENT_CLASSES)
    )


def test_a_quota_halts_the_providers_region_until_a_human_clears_it() -> None:
    assert effect(FailureClass.QUOTA_EXCEEDED).quarantine == QuarantineEffect(
        QuarantineKind.PROVIDER_REGION, None, provider="gcp", region="us-central1"
    )


def test_nothing_to_quarantine_without_its_target() -> None:
    assert effect(FailureClass.STOCKOUT, OutcomeTarget(), on_machine=False).quarantine is None
    assert effect(FailureClass.QUOTA_EXCEEDED, OutcomeTarget(), on_machine=False).quarantine is None


def test_a_replacement_ends_attempts_only_when_the_row_names_a_machine() -> None:
    silent = effect(FailureClass.WENT_SILENT)
    assert (silent.replace_machine, silent.quarantine, silent.incident) == (True, None, False)
    assert not effect(FailureClass.WENT_SILENT, on_machine=False).replace_machine


def test_an_unknown_class_alerts_a_human_and_does_nothing_else() -> None:
    unknown = decide_effect("never_heard_of", route("never_heard_of"), POLICY, TARGET, on_machine=True)
    assert unknown == LedgerEffect(LedgerOutcome.ALERT_HUMAN, incident=True)
