"""Writes the dashboards' JSON (``deploy/grafana/dashboards/<uid>.json``) from the Python that
defines them, or checks that the committed files are what it would write.

    python -m deploy.grafana.generate            write them (scripts/gen-dashboards)
    python -m deploy.grafana.generate --check    exit 1 naming each file that differs

The files are what Grafana's provisioning loads (deploy/grafana/provisioning), so a change
to a dashboard is a change to its Python followed by this; a test runs the check.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from grafana_foundation_sdk.builders.dashboard import Dashboard

from deploy.grafana import fleet_money, panels, scheduler_tenants, watchdogs_ledger

OUT = Path(__file__).resolve().parent / "dashboards"

# uid -> the function that builds it; the file is named for the uid.
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    fleet_money.UID: fleet_money.dashboard,
    scheduler_tenants.UID: scheduler_tenants.dashboard,
    watchdogs_ledger.UID: watchdogs_ledger.dashboard,
}


def render() -> dict[str, str]:
    """File name -> the JSON text Grafana loads (sorted keys, two-space indent, a final
    newline: stable, and readable in a diff)."""
    return {
        f"{uid}.json": json.dumps(panels.build_json(build()), indent=2, sort_keys=True, ensure_ascii=False)
        + "\n"
        for uid, build in DASHBOARDS.items()
    }


def stale(out: Path = OUT) -> list[str]:
    """What in ``out`` differs from what :func:`render` makes: files that differ, are
    missing, or are left over from a dashboard that no longer exists."""
    wanted = render()
    problems = [
        f"{out / name} is out of date: run scripts/gen-dashboards"
        for name, text in wanted.items()
        if not (out / name).is_file() or (out / name).read_text() != text
    ]
    problems += [
        f"{path} is no dashboard of deploy/grafana: delete it or add its Python"
        for path in sorted(out.glob("*.json"))
        if path.name not in wanted
    ]
    return problems


def write(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    wanted = render()
    for name, text in wanted.items():
        (out / name).write_text(text)
    for path in out.glob("*.json"):
        if path.name not in wanted:
            path.unlink()
    return [out / name for name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.grafana.generate", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--check", action="store_true", help="fail when the committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT, help="the dashboards folder (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.out)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for path in write(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
