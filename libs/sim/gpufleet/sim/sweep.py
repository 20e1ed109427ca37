"""``gpufleet simulate --sweep NAME=V1,V2,...``: the operator's question, what happens if I
change a threshold, answered by one month per value under the real nets.

Every value's settings are built and validated before any month runs
(:func:`gpufleet.sim.nets.validated`), so a name the simulator does not read, or a value its
service would refuse or change, is an error naming the field, not a run that quietly kept
the default. Each month has the same seed, so the values meet the same arrivals and the
same faults until the setting itself changes what happens.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from gpufleet.sim.nets import NetSettings, SettingRefused, validated
from gpufleet.sim.report import LIMITS


@dataclass(frozen=True)
class Sweep:
    name: str
    values: tuple[str, ...]
    settings: tuple[NetSettings, ...]


def parse(text: str) -> Sweep:
    """``NAME=V1,V2,...`` with each value's settings built; raises :class:`SettingRefused`."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    values = tuple(v.strip() for v in rest.split(",") if v.strip())
    if not sep or not name or not values:
        raise SettingRefused(f"{text!r}: expected NAME=V1,V2,... (e.g. went_silent_after_s=300,600,900)")
    if len(set(values)) != len(values):
        raise SettingRefused(f"{name}: each value once ({', '.join(values)})")
    return Sweep(name, values, tuple(validated(name, v) for v in values))


def _percentile(sorted_values: list[float], q: float) -> float:
    # Nearest rank: a value that happened, as the report's queue waits are given.
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


def row(result: dict[str, Any]) -> dict[str, Any]:
    """One value's figures: idle GPU-hours, healthy destroys, lost jobs, missed or late
    detections, and each failure class's detection latency as p50 and p95 (nearest rank)
    and max, in seconds from the failure to the net's action (None: none caught)."""
    latency: dict[str, dict[str, float] | None] = {}
    for cls in LIMITS:
        ls = sorted(result.get("_latencies", {}).get(cls, []))
        latency[cls] = (
            {
                "p50_s": round(statistics.median(ls), 1),
                "p95_s": round(_percentile(ls, 0.95), 1),
                "max_s": round(ls[-1], 1),
                "caught": len(ls),
            }
            if ls
            else None
        )
    return {
        "idle_gpu_hours": result["idle_gpu_hours"],
        "healthy_destroys": result["healthy_destroys"],
        "jobs_lost": result["jobs_lost"],
        "missed_or_late_detections": result["missed_or_late_detections"],
        "gpu_hours_billed": result["gpu_hours_billed"],
        "cost_usd": result["cost_usd"],
        "detection_latency": latency,
        "sim_seconds_per_wall_second": result.get("sim_seconds_per_wall_second"),
    }


def table(name: str, rows: dict[str, dict[str, Any]], header: str) -> str:
    """The values side by side: one column a value, one line a figure; detection latency
    per failure class as ``p50/p95`` seconds (nearest rank), '-' where nothing was caught."""
    values = list(rows)
    width = max(14, *(len(v) + 2 for v in values))
    lines = [header, "", f"{name + ' =':34}" + "".join(f"{v:>{width}}" for v in values)]
    for label, key in (
        ("idle GPU-hours", "idle_gpu_hours"),
        ("healthy machines destroyed", "healthy_destroys"),
        ("jobs lost", "jobs_lost"),
        ("failures missed or late", "missed_or_late_detections"),
        ("GPU-hours billed", "gpu_hours_billed"),
        ("cost (USD)", "cost_usd"),
    ):
        lines.append(f"{label:34}" + "".join(f"{_fmt(rows[v][key]):>{width}}" for v in values))
    lines.append("detection latency p50/p95 (s):")
    for cls in LIMITS:
        cells = [rows[v]["detection_latency"][cls] for v in values]
        if not any(cells):
            continue
        lines.append(f"  {cls:32}" + "".join(f"{_latency(c):>{width}}" for c in cells))
    return "\n".join(lines)


def _latency(cell: dict[str, float] | None) -> str:
    return f"{cell['p50_s']:.0f}/{cell['p95_s']:.0f}" if cell else "-"


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)
