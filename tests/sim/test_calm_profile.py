"""A month whose profile turns every failure class off: it runs (a zero rate draws no
event; it once divided by zero), injects nothing, and the control plane detects nothing —
a calm fleet is left alone, which is what a threshold sweep compares its months against."""

from __future__ import annotations

import dataclasses

from gpufleet.common.ledger import FailureClass
from gpufleet.sim.profile import Faults, SimConfig, Workload
from gpufleet.sim.report import summarize
from gpufleet.sim.world import Sim

RATES = [
    f.name for f in dataclasses.fields(Faults) if f.type == "float" and f.name not in ("human_response_s",)
]


def test_a_month_with_every_failure_class_off_injects_and_detects_nothing() -> None:
    assert "restarts_per_month" in RATES and "orphans_per_day" in RATES and "provision_stall" in RATES
    calm = dataclasses.replace(Faults(), **dict.fromkeys(RATES, 0.0))
    workload = dataclasses.replace(Workload(), bursts_per_day=0.0)
    sim = Sim(SimConfig(days=1.0, machines=40, seed=5, faults=calm, workload=workload), "nets")
    sim.run()
    out = summarize(sim, 0.0)
    assert sim.failures == []
    assert all(d["injected"] == 0 for d in out["detections"].values())
    assert out["healthy_destroys"] == 0 and out["jobs_lost"] == 0 and out["violations"] == []
    assert out["jobs"] > 100 and out["jobs_ended"] > 0.8 * out["jobs"]
    # The only ledger rows are the workload's own (jobs that fail by themselves, waits the
    # request watchdogs report): no net found a machine to act on.
    workload_rows = {
        f"ledger:{c.value}"
        for c in (FailureClass.JOB_FAILED, FailureClass.PAID_WAIT, FailureClass.QUEUE_WAIT_TIMEOUT)
    }
    assert {k for k in out["decisions"] if k.startswith("ledger:")} <= workload_rows
