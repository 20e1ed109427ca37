"""Fair share as a month delivered it: each workspace's share of a pool's slots against the
share its plan's weight entitles it to, among the workspaces that wanted more.

What is measured, precisely. At each fleet tick of a pool where at least two workspaces
have work waiting there (a queued job past its back-off), those workspaces *contend*. The
pie is the slots they hold in the pool at that instant (a workspace with nothing waiting
asks for nothing, so what it holds is outside the question). Each contender's
*entitlement* is the pie shared by weighted water-filling: in proportion to its plan's
weight, but never more than it can use — what it holds plus the slots of as many of its
waiting jobs (oldest first) as its plan's cap on jobs at once leaves room for — what it
cannot use going to the others in proportion to theirs. Its *error* at that tick is
``(held - entitled) / pie``: positive when it holds more than its share, in [-1, 1].

Over the month, per workspace: the ticks it contended at; the slot-seconds it received and
was entitled to (each tick's holdings and entitlements held until the pool's next tick,
since nothing the tick reads changed in between); their ratio; the time-weighted mean
absolute error; and the worst error (largest magnitude, sign kept) at any sampled tick.
The scheduler does not preempt, so a workspace that got its slots while alone keeps them
when others arrive: the worst error is the sharpest moment, the ratio the month's verdict.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def entitlements(pie: float, claims: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Weighted water-filling: ``claims`` maps a workspace to (weight, the most it can use).
    Each gets pie x weight / (the weights still open), unless that is more than it can use:
    then it gets what it can use, and the rest is shared again among the others."""
    out = dict.fromkeys(claims, 0.0)
    left = pie
    open_weight = sum(w for w, _ in claims.values())
    # Smallest cap per unit of weight first: whoever is capped below its share is capped
    # below everyone's after it.
    for ws, (weight, cap) in sorted(claims.items(), key=lambda kv: (kv[1][1] / kv[1][0], kv[0])):
        share = left * weight / open_weight if open_weight > 0 else 0.0
        out[ws] = min(cap, share)
        left -= out[ws]
        open_weight -= weight
    return out


@dataclass
class WorkspaceFairness:
    plan: str
    weight: float
    ticks: int = 0
    received_slot_s: float = 0.0
    entitled_slot_s: float = 0.0
    contended_s: float = 0.0
    abs_error_s: float = 0.0  # the integral of |error| over contended time
    worst_error: float = 0.0

    def as_row(self, ws: str) -> dict[str, Any]:
        return {
            "workspace": ws,
            "plan": self.plan,
            "weight": self.weight,
            "ticks": self.ticks,
            "received_slot_h": round(self.received_slot_s / 3600.0, 2),
            "entitled_slot_h": round(self.entitled_slot_s / 3600.0, 2),
            "received_vs_entitled": (
                round(self.received_slot_s / self.entitled_slot_s, 3) if self.entitled_slot_s > 0 else None
            ),
            "mean_abs_error": round(self.abs_error_s / self.contended_s, 3) if self.contended_s > 0 else None,
            "worst_error": round(self.worst_error, 3),
        }


class FairnessLedger:
    """Samples of who contends for a pool's slots, kept as the module says."""

    def __init__(self, plans: dict[str, tuple[str, float]]) -> None:
        self.plans = plans  # workspace -> (plan, weight)
        self.by_ws: dict[str, WorkspaceFairness] = {}
        # pool -> (since, [(workspace, held, entitled, error)]): the last sample, open.
        self.open: dict[str, tuple[float, list[tuple[str, float, float, float]]]] = {}

    def sample(self, pool: str, now: float, contenders: Iterable[tuple[str, float, float]]) -> None:
        """A fleet tick of ``pool``: ``contenders`` are (workspace, slots held, the most it
        could use now) for each workspace with work waiting there."""
        self._credit(pool, now)
        cs = list(contenders)
        pie = sum(held for _, held, _ in cs)
        if len(cs) < 2 or pie <= 0:
            return
        entitled = entitlements(pie, {ws: (self.plans[ws][1], cap) for ws, _, cap in cs})
        open_rows = []
        for ws, held, _ in cs:
            rec = self.by_ws.get(ws)
            if rec is None:
                plan, weight = self.plans[ws]
                rec = self.by_ws[ws] = WorkspaceFairness(plan, weight)
            error = (held - entitled[ws]) / pie
            rec.ticks += 1
            if abs(error) > abs(rec.worst_error):
                rec.worst_error = error
            open_rows.append((ws, held, entitled[ws], error))
        self.open[pool] = (now, open_rows)

    def _credit(self, pool: str, now: float) -> None:
        last = self.open.pop(pool, None)
        if last is None:
            return
        since, rows = last
        span = now - since
        for ws, held, entitled, error in rows:
            rec = self.by_ws[ws]
            rec.received_slot_s += held * span
            rec.entitled_slot_s += entitled * span
            rec.contended_s += span
            rec.abs_error_s += abs(error) * span

    def close(self, end: float) -> None:
        """The month's end: the open samples held until then."""
        for pool in list(self.open):
            self._credit(pool, end)

    def rows(self) -> list[dict[str, Any]]:
        """Every workspace that ever contended, the worst error (in magnitude) first."""
        rows = [rec.as_row(ws) for ws, rec in self.by_ws.items()]
        rows.sort(key=lambda r: (-abs(r["worst_error"]), r["workspace"]))
        return rows


def by_plan(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The workspaces' rows summed by plan: received against entitled slot-hours, and the
    worst error of any workspace on the plan."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        p = out.setdefault(
            r["plan"],
            {"workspaces": 0, "received_slot_h": 0.0, "entitled_slot_h": 0.0, "worst_error": 0.0},
        )
        p["workspaces"] += 1
        p["received_slot_h"] += r["received_slot_h"]
        p["entitled_slot_h"] += r["entitled_slot_h"]
        if abs(r["worst_error"]) > abs(p["worst_error"]):
            p["worst_error"] = r["worst_error"]
    for p in out.values():
        p["received_slot_h"] = round(p["received_slot_h"], 1)
        p["entitled_slot_h"] = round(p["entitled_slot_h"], 1)
        p["received_vs_entitled"] = (
            round(p["received_slot_h"] / p["entitled_slot_h"], 3) if p["entitled_slot_h"] > 0 else None
        )
    return dict(sorted(out.items()))
