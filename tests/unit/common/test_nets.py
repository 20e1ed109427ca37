"""The net registry's own check: how a side that forgets a net fails at import."""

from __future__ import annotations

import pytest

from gpufleet.common import nets


def test_a_side_missing_a_net_fails_naming_it() -> None:
    reaper = nets.of(nets.Service.REAPER)
    names = tuple(n.name for n in reaper if n.name != "went_silent")
    with pytest.raises(RuntimeError, match=r"missing \['went_silent'\]"):
        nets.check_covers("the reaper", names, reaper)


def test_a_side_running_a_net_the_registry_lacks_fails_naming_it() -> None:
    sweeper = nets.of(nets.Service.SWEEPER)
    names = (*(n.name for n in sweeper), "disk_janitor")
    with pytest.raises(RuntimeError, match=r"not registered \['disk_janitor'\]"):
        nets.check_covers("the sweeper", names, sweeper)


def test_the_order_is_part_of_the_contract() -> None:
    # The simulator schedules equal-time passes in this order: a month reproduces only if
    # it is kept.
    sweeper = nets.of(nets.Service.SWEEPER)
    with pytest.raises(RuntimeError, match="order"):
        nets.check_covers("the sweeper", tuple(reversed([n.name for n in sweeper])), sweeper)
    nets.check_covers("the sweeper", tuple(n.name for n in sweeper), sweeper)


def test_a_net_the_simulator_does_not_model_says_why() -> None:
    for net in nets.NETS:
        assert net.simulated == (net.not_simulated == ""), net.name
    assert all(n.simulated for n in nets.simulated())
