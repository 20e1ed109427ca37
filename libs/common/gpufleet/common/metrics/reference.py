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

from gpufleet.common.metrics.catalog import (
    CATALOGUE,
    LABELS,
    SEMCONV_LABELS,
    Instrument,
    Label,
    Metric,
    Origin,
    Stability,
)

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
attempt, a machine or a workspace, whose values grow without end. The gRPC and database
durations OpenTelemetry's semantic conventions define are listed apart, with their own
vocabulary.
"""

_SEMCONV_HEADER = """\
## OpenTelemetry semantic-convention metrics

Metrics that OpenTelemetry's semantic conventions define rather than gpufleet: their names,
units and attribute keys are the conventions' (as the installed
`opentelemetry-semantic-conventions` package spells them), so a dashboard made for any
gRPC service or database client reads them as they are. Their attributes are dotted; the
Prometheus exporter writes each with underscores (`rpc.method` is the label `rpc_method`),
and the tables show both. Never a peer's or a server's address, nor a statement's text.
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
        _code([label.prometheus_key for label in metric.labels]),
        metric.stability.value,
        _cell(metric.description),
    )
    return "| " + " | ".join(cells) + " |"


def _metric_table(metrics: Sequence[Metric]) -> list[str]:
    return [
        "| Name | Prometheus name | Type | Unit | Labels | Stability | Meaning |",
        "|---|---|---|---|---|---|---|",
        *(_metric_row(metric) for metric in metrics),
    ]


def _users(key: str, metrics: Sequence[Metric]) -> str:
    users = [m.prometheus_name for m in metrics if key in m.label_keys]
    return _code(users) if users else "reserved"


def _semconv_section(metrics: Sequence[Metric], vocabulary: dict[str, Label]) -> list[str]:
    lines = ["", _SEMCONV_HEADER, *_metric_table(metrics)]
    lines += ["", "### Their attributes", ""]
    lines += ["| Attribute | Prometheus label | Values | Used by |", "|---|---|---|---|"]
    for key, label in vocabulary.items():
        lines.append(
            f"| `{key}` | `{label.prometheus_key}` | {_cell(label.bound)} | {_users(key, metrics)} |"
        )
    return lines


def render(catalogue: Sequence[Metric] = CATALOGUE) -> str:
    """The reference for ``catalogue``, as committed in ``docs/metrics.md``."""
    own = [m for m in catalogue if m.origin is Origin.GPUFLEET]
    conventional = [m for m in catalogue if m.origin is Origin.SEMCONV]
    lines = [_HEADER, *_metric_table(own)]

    lines += ["", "## Labels", ""]
    lines.append("The only label keys a metric may carry, and what keeps each one's values few.")
    lines.append("A key no metric uses yet is reserved for the metrics to come.")
    lines += ["", "| Label | Values | Used by |", "|---|---|---|"]
    for key, label in LABELS.items():
        lines.append(f"| `{key}` | {_cell(label.bound)} | {_users(key, own)} |")

    if conventional:
        lines += _semconv_section(conventional, SEMCONV_LABELS)

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
