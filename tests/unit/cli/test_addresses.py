"""Where a client command finds the services: the flag, else GPUFLEET_<SERVICE>_ADDRESS,
else what the `gpufleet up` on --state-dir recorded, else the default port."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpufleet.cli import addresses
from gpufleet.cli.main import build_parser


def parsed(*argv: str) -> argparse.Namespace:
    args = build_parser().parse_args(list(argv))
    addresses.resolve(args)
    return args


@pytest.fixture(autouse=True)
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for service in addresses.CLIENT_SERVICES:
        monkeypatch.delenv(addresses.env_var(service), raising=False)


def test_with_nothing_recorded_the_default_ports(tmp_path: Path) -> None:
    args = parsed("watchdogs", "--state-dir", str(tmp_path))
    assert (args.scheduler, args.reaper) == ("127.0.0.1:50051", "127.0.0.1:50052")


def test_the_state_dirs_stack_is_reached_where_it_serves(tmp_path: Path) -> None:
    addresses.write(
        tmp_path, {"scheduler": "127.0.0.1:51751", "reaper": "127.0.0.1:51752", "sweeper": "127.0.0.1:51754"}
    )
    args = parsed("watchdogs", "--state-dir", str(tmp_path))
    assert (args.scheduler, args.reaper) == ("127.0.0.1:51751", "127.0.0.1:51752")
    assert parsed("orphans", "--state-dir", str(tmp_path)).sweeper == "127.0.0.1:51754"


def test_a_flag_wins_then_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    addresses.write(tmp_path, {"scheduler": "127.0.0.1:51751", "reaper": "127.0.0.1:51752"})
    monkeypatch.setenv("GPUFLEET_REAPER_ADDRESS", "10.0.0.5:50052")
    args = parsed("watchdogs", "--state-dir", str(tmp_path), "--scheduler", "10.0.0.9:50051")
    assert (args.scheduler, args.reaper) == ("10.0.0.9:50051", "10.0.0.5:50052")


def test_an_unreadable_record_is_no_record(tmp_path: Path) -> None:
    (tmp_path / addresses.FILE).write_text("{not json")
    assert parsed("jobs", "--state-dir", str(tmp_path)).scheduler == "127.0.0.1:50051"
    (tmp_path / addresses.FILE).write_text('["127.0.0.1:1"]')
    assert parsed("jobs", "--state-dir", str(tmp_path)).scheduler == "127.0.0.1:50051"
