"""The metrics catalogue is the one source (DESIGN.md §11): the committed reference
(docs/metrics.md) is what the catalogue generates, and no code in services/ or libs/
creates an OpenTelemetry instrument except gpufleet.common.metrics, from the catalogue.
Each gate is also shown to fail on a broken copy."""

from __future__ import annotations

import re
from pathlib import Path

from tests.quality._repo import REPO, copy_tree, run

# Where instruments may be created: the catalogue's own package.
METRICS_PACKAGE = Path("libs/common/gpufleet/common/metrics")
_CREATES = re.compile(r"\bcreate_(counter|up_down_counter|histogram|gauge|observable_\w+)\s*\(")
_SKIPPED_PARTS = {".venv", "__pycache__", "build", "dist"}


def reference_check(path: Path | None = None) -> tuple[int, str]:
    argv = [str(REPO / "scripts" / "gen-metrics-doc"), "--check"]
    if path is not None:
        argv.append(str(path))
    result = run(argv)
    return result.returncode, result.stdout + result.stderr


def stray_instruments(root: Path) -> list[str]:
    """``file:line`` of every instrument created under ``root``'s services/ and libs/
    outside the metrics package."""
    found: list[str] = []
    for top in ("services", "libs"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if _SKIPPED_PARTS & set(rel.parts) or any(p.endswith(".egg-info") for p in rel.parts):
                continue
            if rel.is_relative_to(METRICS_PACKAGE):
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if _CREATES.search(line):
                    found.append(f"{rel}:{n}: {line.strip()}")
    return found


def test_the_committed_reference_is_what_the_catalogue_generates() -> None:
    code, output = reference_check()
    assert code == 0, output


def test_the_reference_check_fails_on_a_stale_copy(tmp_path: Path) -> None:
    stale = tmp_path / "metrics.md"
    text = (REPO / "docs" / "metrics.md").read_text()
    stale.write_text(text.replace("gpufleet_reaper_refusals_total", "gpufleet_reaper_refusals"))

    code, output = reference_check(stale)

    assert code != 0, output
    assert f"{stale} is out of date" in output


def test_the_reference_check_fails_when_the_reference_is_missing(tmp_path: Path) -> None:
    code, output = reference_check(tmp_path / "metrics.md")
    assert code != 0 and "out of date" in output, output


def test_no_instrument_is_created_outside_the_catalogue() -> None:
    assert stray_instruments(REPO) == []


def test_the_scan_finds_an_instrument_made_by_hand(tmp_path: Path) -> None:
    copy_tree(tmp_path, "services/reaper/gpufleet/reaper/decision_log.py", str(METRICS_PACKAGE))
    by_hand = tmp_path / "services/reaper/gpufleet/reaper/by_hand.py"
    by_hand.write_text(
        "from opentelemetry import metrics\n\n"
        '_stops = metrics.get_meter("x").create_counter("gpufleet.reaper.stops")\n'
    )

    found = stray_instruments(tmp_path)

    assert found == [
        'services/reaper/gpufleet/reaper/by_hand.py:3: _stops = metrics.get_meter("x")'
        '.create_counter("gpufleet.reaper.stops")'
    ]


def unrecorded(root: Path) -> list[str]:
    """The catalogue's metrics (by their constant's name in catalog.py) that no module under
    ``root``'s services/ and libs/ outside the metrics package names: declared, documented,
    dashboarded and alerted on, and never recorded — a panel that stays empty forever."""
    catalog = (root / METRICS_PACKAGE / "catalog.py").read_text()
    constants = re.findall(r"^([A-Z][A-Z0-9_]+) = Metric\(", catalog, flags=re.MULTILINE)
    sources = "\n".join(
        path.read_text()
        for top in ("services", "libs")
        for path in sorted((root / top).rglob("*.py"))
        if not (_SKIPPED_PARTS & set(path.relative_to(root).parts))
        and not path.relative_to(root).is_relative_to(METRICS_PACKAGE)
    )
    return [c for c in constants if not re.search(rf"\b{c}\b", sources)]


def test_every_declared_metric_is_recorded_somewhere() -> None:
    assert unrecorded(REPO) == []


def test_the_scan_finds_a_metric_nothing_records(tmp_path: Path) -> None:
    copy_tree(tmp_path, "services", "libs")
    catalog = tmp_path / METRICS_PACKAGE / "catalog.py"
    text = catalog.read_text()
    catalog.write_text(
        text.replace(
            "CATALOGUE: tuple[Metric, ...] = (",
            'NEVER_RECORDED = Metric(name="gpufleet.never.recorded", instrument=Instrument.COUNTER, '
            'unit="{thing}", labels=(), description="x", stability=Stability.ALPHA)\n\n'
            "CATALOGUE: tuple[Metric, ...] = (",
        )
    )
    assert "NEVER_RECORDED" in unrecorded(tmp_path)
