"""PNG charts of a run (``--plot DIR``): machines by state over the month, billed against
useful GPU-hours per policy, queue waits by kind and plan, detection latency per class."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no screen: files only
import matplotlib.pyplot as plt

from gpufleet.sim.report import LIMITS

STATES = ("PROVISIONING", "BOOTING", "READY", "DRAINING", "STARTING", "STOPPING", "STOPPED", "DESTROYING")


def write_plots(out: Path, results: dict[str, dict[str, Any]]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [_states(out, results), _billed(out, results), _waits(out, results), _latency(out, results)]
    return [p for p in paths if p is not None]


def _states(out: Path, results: dict[str, dict[str, Any]]) -> Path | None:
    r = results.get("nets")
    if not r or not r.get("_samples"):
        return None
    samples = r["_samples"]
    days = [t / 86400.0 for t, *_ in samples]
    fig, ax = plt.subplots(figsize=(10, 4))
    stacks = [[s[1].get(state, 0) for s in samples] for state in STATES]
    ax.stackplot(days, stacks, labels=STATES)
    ax.set_xlabel("day")
    ax.set_ylabel("machines")
    ax.set_title("Machines by state (real nets)")
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    return _save(fig, out / "machines_by_state.png")


def _billed(out: Path, results: dict[str, dict[str, Any]]) -> Path | None:
    fig, ax = plt.subplots(figsize=(10, 4))
    for policy, r in results.items():
        samples = r.get("_samples") or []
        if not samples:
            continue
        days = [t / 86400.0 for t, *_ in samples]
        ax.plot(days, [(b - u) / 3600.0 for _, _, b, u in samples], label=f"{policy}: billed, no job")
    ax.set_xlabel("day")
    ax.set_ylabel("GPU-hours (cumulative)")
    ax.set_title("GPU-hours billed without useful work, by policy")
    ax.legend()
    return _save(fig, out / "idle_gpu_hours.png")


def _waits(out: Path, results: dict[str, dict[str, Any]]) -> Path | None:
    r = results.get("nets")
    if not r or not r.get("_waits"):
        return None
    keys = sorted(r["_waits"])
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.boxplot([[w / 60.0 for w in r["_waits"][k]] for k in keys], showfliers=False)
    ax.set_xticks(range(1, len(keys) + 1), keys, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("minutes from submission to start")
    ax.set_title("Queue wait by kind and plan (real nets)")
    return _save(fig, out / "queue_wait.png")


def _latency(out: Path, results: dict[str, dict[str, Any]]) -> Path | None:
    r = results.get("nets")
    if not r or not r.get("_latencies"):
        return None
    classes = [c for c in LIMITS if r["_latencies"].get(c)]
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.boxplot([[v / 60.0 for v in r["_latencies"][c]] for c in classes], showfliers=True)
    d = r["detections"]
    limits = [(d[c]["threshold_s"] + d[c]["cadence_s"]) / 60.0 for c in classes]
    ax.scatter(range(1, len(classes) + 1), limits, marker="_", s=400, color="red", label="design limit")
    ax.set_xticks(range(1, len(classes) + 1), classes, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("minutes from failure to caught")
    ax.set_title("Detection latency per failure class (real nets)")
    ax.legend()
    return _save(fig, out / "detection_latency.png")


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_sweep_plot(out: Path, name: str, rows: dict[str, dict[str, Any]]) -> Path:
    """One chart of a sweep (``sweep_<name>.png``): idle GPU-hours, healthy destroys and lost
    jobs per value, and each caught class's detection latency (p50, p95 dashed) per value."""
    out.mkdir(parents=True, exist_ok=True)
    values = list(rows)
    xs = range(len(values))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.bar(xs, [rows[v]["idle_gpu_hours"] for v in values], color="tab:blue", label="idle GPU-hours")
    left.set_ylabel("idle GPU-hours")
    counts = left.twinx()
    counts.plot(
        xs, [rows[v]["healthy_destroys"] for v in values], "o-", color="tab:red", label="healthy destroys"
    )
    counts.plot(xs, [rows[v]["jobs_lost"] for v in values], "s--", color="tab:gray", label="jobs lost")
    counts.set_ylabel("count")
    counts.set_ylim(
        bottom=0,
        top=max(1, *(rows[v]["healthy_destroys"] for v in values), *(rows[v]["jobs_lost"] for v in values))
        * 1.2,
    )
    left.set_xticks(list(xs), values)
    left.set_xlabel(name)
    left.set_title("Money and harm per value")
    handles = left.get_legend_handles_labels()[0] + counts.get_legend_handles_labels()[0]
    left.legend(handles, [str(h.get_label()) for h in handles], fontsize=8, loc="upper left")
    for i, cls in enumerate(LIMITS):
        cells = [rows[v]["detection_latency"][cls] for v in values]
        if not any(cells):
            continue
        color = f"C{i % 10}"
        p50 = [c["p50_s"] / 60.0 if c else float("nan") for c in cells]
        p95 = [c["p95_s"] / 60.0 if c else float("nan") for c in cells]
        right.plot(xs, p50, "o-", color=color, label=cls)
        right.plot(xs, p95, "--", color=color)
    right.set_xticks(list(xs), values)
    right.set_xlabel(name)
    right.set_ylabel("minutes from failure to caught")
    right.set_title("Detection latency per class: p50 (solid), p95 (dashed)")
    right.legend(fontsize=7, ncol=2)
    path = _save(fig, out / f"sweep_{name}.png")
    return path
