"""The Grafana dashboards (deploy/grafana): the committed JSON is what their Python generates,
every query parses as PromQL (promtool), names only metrics the catalogue defines and
groups only by labels those metrics carry, every catalogue metric is on a dashboard, and the
panels that count traceable work link to Jaeger. Each check is also shown to fail on a
broken copy."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.grafana.queries import PanelQuery, panel_queries
from gpufleet.common.metrics.catalog import CATALOGUE, Instrument, Metric
from tests.quality._repo import REPO, run

DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")
BY_PROMETHEUS_NAME = {m.prometheus_name: m for m in CATALOGUE}

# PromQL words that are not metric names where they stand.
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_IDENTIFIER = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: scripts/bootstrap --dev installs Debian's prometheus (as root)")
    return found


def series_named(expr: str) -> set[str]:
    """The series names a PromQL expression selects: its identifiers that are not a
    function or aggregation (followed by ``(``), a keyword, a label in a matcher or a
    grouping, a string or a duration."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    return {
        name
        for name, call in _IDENTIFIER.findall(text)
        if not call and name not in _KEYWORDS and not re.fullmatch(r"[eE]\d*|inf|nan|Inf|NaN", name)
    }


def grouping_labels(expr: str) -> set[str]:
    """Every label an expression groups by (``by (...)``, ``without (...)``)."""
    return {
        label.strip()
        for keyword, labels in _GROUPING.findall(_STRING.sub('""', expr))
        if keyword in ("by", "without")
        for label in labels.split(",")
        if label.strip()
    }


def metric_of(series: str) -> Metric | None:
    """The catalogue metric a series belongs to (a histogram's ``_bucket``, ``_sum``,
    ``_count`` are its own)."""
    if series in BY_PROMETHEUS_NAME:
        return BY_PROMETHEUS_NAME[series]
    for suffix in HISTOGRAM_SERIES:
        base = BY_PROMETHEUS_NAME.get(series.removesuffix(suffix))
        if series.endswith(suffix) and base is not None and base.instrument is Instrument.HISTOGRAM:
            return base
    return None


def prometheus_labels(metric: Metric) -> set[str]:
    """A metric's label names as Prometheus stores them (a convention's ``rpc.method`` is
    ``rpc_method``: the exporter turns what a Prometheus label may not hold into ``_``)."""
    return {re.sub(r"[^a-zA-Z0-9_]", "_", key) for key in metric.label_keys}


def unknown_series(queries: list[PanelQuery]) -> list[str]:
    return [
        f"{q.dashboard} / {q.panel}: {name} is no metric of the catalogue"
        for q in queries
        for name in sorted(series_named(q.expr))
        if metric_of(name) is None
    ]


def unknown_groupings(queries: list[PanelQuery]) -> list[str]:
    """Labels grouped by that no metric of the expression carries (``le`` is a histogram's)."""
    problems = []
    for q in queries:
        metrics = [m for m in map(metric_of, series_named(q.expr)) if m is not None]
        carried = set().union(*(prometheus_labels(m) for m in metrics)) | {"le"}
        problems += [
            f"{q.dashboard} / {q.panel}: no metric here has label {label}"
            for label in sorted(grouping_labels(q.expr) - carried)
        ]
    return problems


def promtool_parse(queries: list[PanelQuery], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules`` on a rules file with each query as a recording rule: it
    parses every expression (Grafana's variables substituted, as Prometheus receives them)."""
    rules = [{"record": f"gpufleet_dashboard_query_{i}", "expr": q.promql()} for i, q in enumerate(queries)]
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    return run([promtool(), "check", "rules", str(path)])


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for panel in board["panels"]:
        found.append(panel)
        found.extend(panel.get("panels") or [])
    return found


def links(panel: dict[str, Any]) -> list[str]:
    return [link["url"] for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])]


# --- the JSON is the code's -------------------------------------------------------------


def dashboards_check(folder: Path | None = None) -> tuple[int, str]:
    argv = [str(REPO / "scripts" / "gen-dashboards"), "--check"]
    if folder is not None:
        argv += ["--out", str(folder)]
    result = run(argv)
    return result.returncode, result.stdout + result.stderr


def test_the_committed_dashboards_are_what_their_python_generates() -> None:
    code, output = dashboards_check()
    assert code == 0, output
    assert set(dashboards()) == {
        "gpufleet-fleet-money.json",
        "gpufleet-scheduler-tenants.json",
        "gpufleet-watchdogs-ledger.json",
    }


def test_the_check_fails_on_an_edited_a_missing_or_a_stray_dashboard(tmp_path: Path) -> None:
    shutil.copytree(DASHBOARDS, tmp_path, dirs_exist_ok=True)
    edited = tmp_path / "gpufleet-fleet-money.json"
    edited.write_text(edited.read_text().replace("gpufleet_fleet_gpu_idle_seconds_total", "gpufleet_idle"))
    (tmp_path / "gpufleet-scheduler-tenants.json").unlink()
    (tmp_path / "hand-made.json").write_text("{}")

    code, output = dashboards_check(tmp_path)

    assert code != 0
    assert f"{edited} is out of date" in output
    assert f"{tmp_path / 'gpufleet-scheduler-tenants.json'} is out of date" in output
    assert f"{tmp_path / 'hand-made.json'} is no dashboard" in output


# --- the queries --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def queries() -> list[PanelQuery]:
    found = panel_queries()
    assert len(found) > 40
    return found


def test_every_query_parses_as_promql(queries: list[PanelQuery], tmp_path: Path) -> None:
    checked = promtool_parse(queries, tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout


def test_the_parse_check_fails_on_a_broken_query(queries: list[PanelQuery], tmp_path: Path) -> None:
    q = queries[0]
    broken = PanelQuery(q.uid, q.dashboard, q.panel, q.ref_id, q.expr.replace(")", "", 1), q.instant)
    checked = promtool_parse([broken], tmp_path)
    assert checked.returncode != 0


def test_every_query_names_only_metrics_the_catalogue_defines(queries: list[PanelQuery]) -> None:
    assert unknown_series(queries) == []
    assert unknown_groupings(queries) == []


def test_the_name_check_reads_names_and_not_functions_labels_or_strings() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (kind, le) (rate(gpufleet_scheduler_queue_wait_seconds_bucket"
        '{kind!="gpufleet_x"}[$__rate_interval]))) / on (kind) group_left (pool) gpufleet_jobs_started_total'
        " > bool 1e3 or vector(0) + time() - gpufleet_watchdog_last_run_seconds offset 5m"
    )
    assert series_named(expr) == {
        "gpufleet_scheduler_queue_wait_seconds_bucket",
        "gpufleet_jobs_started_total",
        "gpufleet_watchdog_last_run_seconds",
    }
    assert grouping_labels(expr) == {"kind", "le"}


def test_the_name_check_fails_on_a_metric_or_a_label_the_catalogue_lacks() -> None:
    made_up = PanelQuery(
        "u", "D", "P", "A", "sum by (workspace) (gpufleet_fleet_machines) + gpufleet_gpus", False
    )
    not_a_histogram = PanelQuery("u", "D", "P", "B", "sum(gpufleet_fleet_machines_bucket)", False)
    assert unknown_series([made_up, not_a_histogram]) == [
        "D / P: gpufleet_gpus is no metric of the catalogue",
        "D / P: gpufleet_fleet_machines_bucket is no metric of the catalogue",
    ]
    assert unknown_groupings([made_up]) == ["D / P: no metric here has label workspace"]


def test_every_catalogue_metric_is_on_a_dashboard(queries: list[PanelQuery]) -> None:
    shown = {metric_of(name) for q in queries for name in series_named(q.expr)}
    missing = [m.prometheus_name for m in CATALOGUE if m not in shown]
    assert missing == [], "give each a panel in deploy/grafana, then run scripts/gen-dashboards"


def test_promql_substitutes_grafanas_variables_and_refuses_others() -> None:
    q = PanelQuery("u", "D", "P", "A", "increase(x[$__range]) / rate(x[$__rate_interval])", True)
    assert q.promql() == "increase(x[1h]) / rate(x[5m])"
    assert q.promql({"$__range": "6h"}) == "increase(x[6h]) / rate(x[5m])"
    with pytest.raises(ValueError, match=r"\$pool"):
        PanelQuery("u", "D", "P", "A", 'x{pool=~"$pool"}', False).promql()


# --- the dashboards' shape ------------------------------------------------------------------


def test_every_panel_queries_the_dashboards_prometheus_variable() -> None:
    for name, board in dashboards().items():
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource", name
        assert variables["datasource"]["query"] == "prometheus", name
        ids = [p["id"] for p in panels(board)]
        assert len(ids) == len(set(ids)), f"{name}: panel ids repeat"
        for panel in panels(board):
            assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["targets"], f"{name} / {panel['title']}: no query"
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"], panel["title"]
    uids = [board["uid"] for board in dashboards().values()]
    assert len(uids) == len(set(uids))


def test_panels_counting_traceable_work_link_to_jaegers_search_for_their_spans() -> None:
    """Provider calls are spans of the provisioner (provider.<operation>); dispatches are the
    scheduler's StartJobs calls; a net's pass is the reaper's reaper.<net>.tick."""
    provisioner = "service=gpufleet-provisioner&operation=provider."
    start_jobs = "service=gpufleet-scheduler&operation=%2Fgpufleet.v1.AgentService%2FStartJobs"
    net_pass = "service=gpufleet-reaper&operation=reaper.${__field.labels.net}.tick"
    expected = {
        "gpufleet_provider_calls_total": provisioner + "${__field.labels.operation}",
        "gpufleet_provider_call_duration_seconds_bucket": provisioner + "${__field.labels.operation}",
        "gpufleet_provider_stockouts_total": provisioner + "create",
        "gpufleet_scheduler_dispatch_failures_total": start_jobs,
        "gpufleet_scheduler_dispatch_duration_seconds_bucket": start_jobs,
        "gpufleet_reaper_actions_total": net_pass,
        "gpufleet_reaper_refusals_total": net_pass,
    }
    seen = set()
    for board in dashboards().values():
        for panel in panels(board):
            named = set().union(*(series_named(t["expr"]) for t in panel.get("targets", [])))
            for series, search in expected.items():
                if series in named:
                    seen.add(series)
                    urls = links(panel)
                    assert urls, f"{panel['title']}: counts {series} and links to no traces"
                    assert all(u.startswith("${jaeger}/search?") and search in u for u in urls), urls
                    assert all("start=${__from}000&end=${__to}000" in u for u in urls), urls
    assert seen == set(expected)
    (jaeger,) = [v for v in next(iter(dashboards().values()))["templating"]["list"] if v["name"] == "jaeger"]
    assert jaeger["query"] == "http://localhost:16686"
