"""``docs/metrics.md``, generated from the catalogue.

    python -m gpufleet.common.metrics.reference PATH            write the reference to PATH
    python -m gpufleet.common.metrics.reference --check PATH    fail when PATH differs

``scripts/gen-metrics-doc`` runs it on the repository's ``docs/metrics.md``; a quality
test runs the check, so a metric added, renamed or relabelled in the catalogue without
regenerating the reference fails the build, as a proto changed without ``genproto`` does.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from gpufleet.common.metrics.catalog import CATALOGUE, LABELS, Instrument, Metric, Stability

_HEADER = """\
# Metrics reference

<!-- Generated from libs/common/gpufleet/common/metrics/catalog.py by scripts/gen-metrics-doc.
     Do not edit: change the catalogue and regenerate (a test fails until they agree). -->

Every metric gpufleet records, as the code declares it. Names are OpenTelemetry's (dotted);
the Prometheus name is what a Prometheus server stores it under after OpenTelemetry's
conversion (dots to underscores, the unit's word, `_total` on a counter), and what PromQL
queries name. A histogram is queried as `<name>_bucket`, `<name>_sum` and `<name>_count`.
Prometheus adds each scrape target's own `job` and `instance` labels.

Units are UCUM as OpenTelemetry writes them: `s` for durations, `{thing}` for a count (no
suffix in Prometheus). Labels come from one bounded vocabulary (below): never a job, an
attempt, a machine or a workspace, whose values grow without end.
"""

_KIND = {
    Instrument.COUNTER: "counter",
    Instrument.UP_DOWN_COUNTER: "up-down counter (gauge)",
    Instrument.HISTOGRAM: "histogram",
    Instrument.OBSERVABLE_GAUGE: "gauge",
}

_STABILITY = {
    Stability.STABLE: "name, unit, labels and meaning are kept; a change ships old and new side "
    "by side for a release, said in the changelog.",
    Stability.BETA: "the meaning is kept; the name or labels may still change, said in the changelog.",
    Stability.ALPHA: "new; may change or go without notice.",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(items: Sequence[str]) -> str:
    return ", ".join(f"`{item}`" for item in items) or "—"


def _number(value: float) -> str:
    return f"{value:g}"


def _metric_row(metric: Metric) -> str:
    cells = (
        f"`{metric.name}`",
        f"`{metric.prometheus_name}`",
        _KIND[metric.instrument],
        f"`{metric.unit}`",
        _code([label.key for label in metric.labels]),
        metric.stability.value,
        _cell(metric.description),
    )
    return "| " + " | ".join(cells) + " |"


def render(catalogue: Sequence[Metric] = CATALOGUE) -> str:
    """The reference for ``catalogue``, as committed in ``docs/metrics.md``."""
    lines = [_HEADER]
    lines.append("| Name | Prometheus name | Type | Unit | Labels | Stability | Meaning |")
    lines.append("|---|---|---|---|---|---|---|")
    lines += [_metric_row(metric) for metric in catalogue]

    lines += ["", "## Labels", ""]
    lines.append("The only label keys a metric may carry, and what keeps each one's values few.")
    lines.append("A key no metric uses yet is reserved for the metrics to come.")
    lines += ["", "| Label | Values | Used by |", "|---|---|---|"]
    for key, label in LABELS.items():
        users = [m.prometheus_name for m in catalogue if key in m.label_keys]
        lines.append(f"| `{key}` | {_cell(label.bound)} | {_code(users) if users else 'reserved'} |")

    histograms = [m for m in catalogue if m.instrument is Instrument.HISTOGRAM]
    if histograms:
        lines += ["", "## Histogram buckets", ""]
        lines.append("Upper bounds (`le`), in the metric's unit.")
        lines.append("")
        for metric in histograms:
            lines.append(f"- `{metric.prometheus_name}`: {', '.join(map(_number, metric.buckets))}")

    lines += ["", "## Stability", ""]
    lines += [f"- **{level.value}**: {_STABILITY[level]}" for level in Stability]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write or check the generated metrics reference.")
    parser.add_argument("--check", action="store_true", help="fail when PATH differs from the catalogue's")
    parser.add_argument("path", type=Path)
    args = parser.parse_args(argv)
    wanted = render()
    if args.check:
        have = args.path.read_text() if args.path.exists() else None
        if have != wanted:
            print(
                f"gen-metrics-doc: {args.path} is out of date with the metrics catalogue; "
                "run scripts/gen-metrics-doc and commit",
                file=sys.stderr,
            )
            return 1
        return 0
    args.path.parent.mkdir(parents=True, exist_ok=True)
    args.path.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
