"""The one offering a simulator ``Script`` runs on in the tests: a two-slot on-demand L4 of
the ``sim`` provider, as the services' sim driver serves it."""

from __future__ import annotations

from gpufleet.sim.profile import Offering
from gpufleet.sim.world import Sim

OFFERING = Offering(
    id="sim-l4",
    pool="l4",
    provider="SIM",
    region="sim-1",
    zone="sim-1a",
    instance_type="sim.l4",
    capacity_type="ON_DEMAND",
    hourly_usd=0.8,
    preempt_rate_s=0.0,
    source="the tests' script",
    as_of="2026-12",
)


def job_moves(sim: Sim) -> dict[str, list[tuple[float, str]]]:
    """Each job's states in a run's history, in order, with when it entered each."""
    assert sim.history is not None
    moves: dict[str, list[tuple[float, str]]] = {}
    for t, what, ident, state in sim.history:
        if what == "job":
            moves.setdefault(ident, []).append((t, state))
    return moves
