"""The few shapes every gpufleet dashboard is built from, so the three read alike.

Every panel queries the dashboard's Prometheus datasource variable (``$datasource``), so a
dashboard works against whichever Prometheus an operator picks, the provisioned one or
another. Rates use Grafana's ``$__rate_interval`` (at least four scrapes, whatever the zoom);
a rare event (an orphan, a stockout, a ledger row) is counted over the trailing hour
instead, where a per-second rate would read 0.0003.

Traces: the series carry no exemplars (OpenTelemetry's Prometheus exporter, which serves the
metrics listeners, writes none), so a panel that counts something a span records links to
Jaeger's search for those spans instead (:func:`jaeger_search`), for the series clicked and
the dashboard's time range.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
)

from gpufleet.common.metrics.catalog import Instrument, Metric

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
JAEGER_VARIABLE = "jaeger"
# Where an operator's browser reaches Jaeger's UI: docker-compose.yml publishes it here.
JAEGER_DEFAULT_URL = "http://localhost:16686"

# Panel sizes on Grafana's 24-column grid.
FULL, HALF, THIRD, QUARTER = 24, 12, 8, 6
HEIGHT = 8
STAT_HEIGHT = 4

# Quantiles a duration panel shows.
QUANTILES = (0.5, 0.95, 0.99)


def new_dashboard(title: str, uid: str, description: str) -> dashboard.Dashboard:
    """A dashboard with the datasource and Jaeger variables, shared crosshair, 30 s refresh."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["gpufleet"])
        .editable()
        .time("now-6h", "now")
        .refresh("30s")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .with_variable(
            dashboard.DatasourceVariable(DATASOURCE_VARIABLE)
            .label("Prometheus")
            .type("prometheus")
            .description("The Prometheus that scrapes gpufleet's metrics listeners")
        )
        .with_variable(
            dashboard.TextBoxVariable(JAEGER_VARIABLE)
            .label("Jaeger UI")
            .default_value(JAEGER_DEFAULT_URL)
            .description("Where your browser reaches Jaeger's UI: the panels' trace links open it")
        )
    )


def query(expr: str, legend: str = "__auto", ref_id: str = "A") -> prometheus.Dataquery:
    """A range query of the dashboard's Prometheus."""
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(DATASOURCE)


def instant(expr: str, legend: str = "__auto", ref_id: str = "A") -> prometheus.Dataquery:
    """An instant query (a stat's one figure)."""
    return query(expr, legend, ref_id).instant()


def prometheus_labels(metric: Metric) -> frozenset[str]:
    """A metric's label names as Prometheus stores them (the catalogue's ``Label.prometheus_key``:
    a semantic convention's ``rpc.method`` is ``rpc_method``)."""
    return frozenset(label.prometheus_key for label in metric.labels)


def _labels(metric: Metric, by: Sequence[str]) -> str:
    """``by`` as a PromQL label list, each checked to be one of the metric's labels: a
    dashboard grouping by a label the metric lacks shows one unlabelled line, silently."""
    unknown = set(by) - prometheus_labels(metric)
    if unknown:
        raise ValueError(f"{metric.prometheus_name} has no label {', '.join(sorted(unknown))}")
    return ", ".join(by)


def _selector(series: str, where: str) -> str:
    return f"{series}{{{where}}}" if where else series


def gauge(metric: Metric, by: Sequence[str] = (), where: str = "") -> str:
    """A gauge summed across the processes that report it, by ``by``."""
    selector = _selector(metric.prometheus_name, where)
    return f"sum by ({_labels(metric, by)}) ({selector})" if by else f"sum({selector})"


def per_minute(metric: Metric, by: Sequence[str] = (), where: str = "") -> str:
    """A counter's rate per minute, by ``by``; for a histogram, the rate of what it measured
    (its ``_count``)."""
    series = metric.prometheus_name
    if metric.instrument is Instrument.HISTOGRAM:
        series += "_count"
    rate = f"rate({_selector(series, where)}[$__rate_interval])"
    return f"60 * sum by ({_labels(metric, by)}) ({rate})" if by else f"60 * sum({rate})"


def trailing_hour(metric: Metric, by: Sequence[str] = (), where: str = "") -> str:
    """How many a counter counted in the hour before each point, by ``by`` (rare events)."""
    increase = f"increase({_selector(metric.prometheus_name, where)}[1h])"
    return f"sum by ({_labels(metric, by)}) ({increase})" if by else f"sum({increase})"


def quantile_queries(
    metric: Metric, by: Sequence[str] = (), where: str = "", quantiles: Sequence[float] = QUANTILES
) -> list[prometheus.Dataquery]:
    """One query per quantile of a histogram, per series of ``by``: ``histogram_quantile``
    over its buckets' rates, summed across the processes that record it."""
    keep = ", ".join([_labels(metric, by), "le"]) if by else "le"
    buckets = _selector(f"{metric.prometheus_name}_bucket", where)
    prefix = " ".join(f"{{{{{name}}}}}" for name in by)
    return [
        query(
            f"histogram_quantile({q:g}, sum by ({keep}) (rate({buckets}[$__rate_interval])))",
            legend=f"{prefix} p{round(q * 100)}".strip(),
            ref_id=chr(ord("A") + i),
        )
        for i, q in enumerate(quantiles)
    ]


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds: ``(None, base colour)`` then ``(value, colour)`` from that value up."""
    return (
        dashboard.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=value, color=color) for value, color in steps])
    )


def graph(
    title: str,
    description: str,
    targets: Sequence[prometheus.Dataquery],
    *,
    unit: str = "short",
    width: int = HALF,
    stacked: bool = False,
    bars: bool = False,
    links: Sequence[dashboard.DashboardLink] = (),
    limit: dashboard.ThresholdsConfig | None = None,
) -> timeseries.Panel:
    """A time series panel. ``limit``: thresholds drawn as a dashed line (an alert's bound)."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(list(targets))
        .unit(unit)
        .span(width)
        .height(HEIGHT)
        .fill_opacity(20 if stacked else 10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.LIST)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS)
    if links:
        panel = panel.data_links(list(links))
    if limit is not None:
        panel = panel.thresholds(limit).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.DASHED)
        )
    return panel


def single(
    title: str,
    description: str,
    target: prometheus.Dataquery,
    *,
    unit: str = "short",
    width: int = QUARTER,
    colours: dashboard.ThresholdsConfig | None = None,
    decimals: int | None = None,
) -> stat.Panel:
    """A stat: one figure, now or over the dashboard's range, coloured by ``colours``."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .with_target(target)
        .unit(unit)
        .span(width)
        .height(STAT_HEIGHT)
        .graph_mode(common.BigValueGraphMode.NONE)
        .color_mode(common.BigValueColorMode.NONE if colours is None else common.BigValueColorMode.BACKGROUND)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if colours is not None:
        panel = panel.thresholds(colours)
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def row(title: str) -> dashboard.Row:
    return dashboard.Row(title)


_VARIABLE = re.compile(r"(\$\{[^}]+\})")


def _encoded(text: str) -> str:
    """``text`` URL-encoded except its Grafana variables (``${...}``), which Grafana
    substitutes when the link is followed (label values are plain words: nothing to encode)."""
    return "".join(p if _VARIABLE.fullmatch(p) else quote(p, safe="") for p in _VARIABLE.split(text))


def jaeger_search(
    title: str, service: str, operation: str = "", tags: Sequence[tuple[str, str]] = ()
) -> dashboard.DashboardLink:
    """A data link to Jaeger's search: the spans of ``service`` (its OpenTelemetry
    ``service.name``) named ``operation``, with ``tags``, in the dashboard's time range.
    ``operation`` and the tags' values may name the clicked series' labels
    (``${__field.labels.provider}``). Jaeger takes its times in microseconds."""
    url = f"${{{JAEGER_VARIABLE}}}/search?service={_encoded(service)}"
    if operation:
        url += f"&operation={_encoded(operation)}"
    if tags:
        url += f"&tags={_encoded(json.dumps(dict(tags), separators=(',', ':')))}"
    url += "&start=${__from}000&end=${__to}000&lookback=custom&limit=50"
    return dashboard.DashboardLink(title).url(url).target_blank(True)


def label(name: str) -> str:
    """The clicked series' value of label ``name``, for a data link."""
    return f"${{__field.labels.{name}}}"


def build_json(board: dashboard.Dashboard) -> dict[str, Any]:
    """The dashboard as the JSON object Grafana loads, each panel (rows included) numbered
    in order: Grafana needs the ids unique, and numbering them here keeps the file stable."""
    data = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    assert isinstance(data, dict)
    for number, panel in enumerate(data["panels"], 1):
        panel["id"] = number
    return data
