"""The alert rules (deploy/prometheus/alerts.yml): valid for Prometheus, each one fires on
the series it is meant for and stays quiet on the others (promtool's own unit tests), names
only metrics the catalogue defines, and points at a runbook section that exists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.common.metrics.catalog import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: scripts/bootstrap --dev installs Debian's prometheus (as root)")
    return found


def rules() -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_the_rules_are_valid_and_their_unit_tests_pass() -> None:
    checked = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool(), "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test() -> None:
    tested = {
        case["alertname"]
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group.get("alert_rule_test", [])
    }
    assert {r["alert"] for r in rules()} <= tested


def test_the_rules_name_only_metrics_the_catalogue_defines() -> None:
    known = {m.prometheus_name for m in CATALOGUE}
    for rule in rules():
        for name in re.findall(r"\bgpufleet_[a-z0-9_]+", str(rule["expr"])):
            base = next((name[: -len(s)] for s in HISTOGRAM_SERIES if name.endswith(s)), name)
            assert name in known or base in known, f"{rule['alert']} names {name}, which no metric is"


def test_every_rule_points_at_a_runbook_section_that_exists() -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("## ")
    }
    for rule in rules():
        url = str(rule["annotations"]["runbook_url"])  # type: ignore[index]
        path, _, anchor = url.partition("#")
        assert path == "docs/runbook.md" and anchor in anchors, f"{rule['alert']}: {url}"
