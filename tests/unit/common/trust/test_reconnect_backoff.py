"""Every channel gpufleet opens dials again within seconds of its server coming back: a
machine's worker must report soon after a control-plane restart, before its attempts' lease
fence (half the lease) stops jobs that nothing was wrong with."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from gpufleet.common.trust.transport import RECONNECT_BACKOFF, Transport


def test_a_channel_caps_the_reconnect_back_off_far_inside_the_lease_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(grpc, "insecure_channel", lambda address, options: opened.append(options))
    Transport("dep", None).channel("127.0.0.1:1", "scheduler.dep")
    options = dict(opened[0])
    assert options["grpc.max_reconnect_backoff_ms"] <= 5000
    # 45 s is the fence of the default 90 s lease: several tries fit in it.
    assert options["grpc.max_reconnect_backoff_ms"] * 5 < 45_000


def test_a_caller_s_own_back_off_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Any] = []
    monkeypatch.setattr(grpc, "insecure_channel", lambda address, options: opened.append(options))
    Transport("dep", None).channel("127.0.0.1:1", "s", [("grpc.max_reconnect_backoff_ms", 250)])
    assert dict(opened[0])["grpc.max_reconnect_backoff_ms"] == 250
    assert [name for name, _ in opened[0]].count("grpc.max_reconnect_backoff_ms") == 1
    assert (
        dict(RECONNECT_BACKOFF)["grpc.initial_reconnect_backoff_ms"]
        == dict(opened[0])["grpc.initial_reconnect_backoff_ms"]
    )
