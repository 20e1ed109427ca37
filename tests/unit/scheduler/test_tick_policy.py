"""The fleet tick's policy is built in one place, from the scheduler's settings: the tick
and a simulated month (which sets only the fleet ceiling it simulates) read the same one."""

from __future__ import annotations

from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.model import Policy


def test_every_setting_the_decision_reads_comes_from_the_settings() -> None:
    s = Settings(max_running_machines=12, worker_fresh_s=45, fair_share_quantum_s=60, film_share=0.25)
    assert s.tick_policy() == Policy(
        max_running_machines=12, worker_fresh_s=45, fair_share_quantum_s=60, film_share=0.25
    )
    # A simulated month's ceiling replaces the setting's, and nothing else.
    assert s.tick_policy(500) == Policy(
        max_running_machines=500, worker_fresh_s=45, fair_share_quantum_s=60, film_share=0.25
    )


def test_the_defaults_are_the_decisions_defaults() -> None:
    policy = Settings.model_construct().tick_policy()
    assert (policy.fair_share_quantum_s, policy.film_share) == (
        Policy.__dataclass_fields__["fair_share_quantum_s"].default,
        Policy.__dataclass_fields__["film_share"].default,
    )
