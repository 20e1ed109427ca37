"""Host-wide names: stable, unique to a stack and a machine, and valid Linux user names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpufleet.common.host_names import (
    HostNames,
    local_walls_name,
    machine_walls_name,
    stack_walls_prefix,
)

# useradd's own limit, and the alphabet of a portable user name.
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def test_two_stacks_machine_zero_share_nothing_on_the_host(tmp_path: Path) -> None:
    one = HostNames(local_walls_name(tmp_path / "stack-a" / "machines", 0))
    two = HostNames(local_walls_name(tmp_path / "stack-b" / "machines", 0))
    assert one.slot_user(0) != two.slot_user(0)
    assert one.walls_root != two.walls_root
    assert one.jobs_cgroup != two.jobs_cgroup


def test_a_stack_re_uses_a_machine_numbers_names(tmp_path: Path) -> None:
    root = tmp_path / "machines"
    assert local_walls_name(root, 3) == local_walls_name(tmp_path / "." / "machines", 3)
    assert local_walls_name(root, 3) != local_walls_name(root, 4)
    assert local_walls_name(root, 12).startswith(stack_walls_prefix(root))


@pytest.mark.parametrize("index", [0, 9, 99_999])
def test_every_slot_user_is_a_valid_user_name(tmp_path: Path, index: int) -> None:
    for walls_name in (
        local_walls_name(tmp_path / ("x" * 200), index),
        machine_walls_name("a" * 63, "m" * 128, tmp_path),
    ):
        names = HostNames(walls_name)
        assert USER_NAME.match(names.slot_user(63)), names.slot_user(63)


@pytest.mark.parametrize("bad", ["", "UPPER", "-x", "a" * 21, "a/b"])
def test_a_name_that_cannot_make_a_user_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="walls name"):
        HostNames(bad)
