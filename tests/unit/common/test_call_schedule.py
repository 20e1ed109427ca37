"""How long a client call waits on a server that answers none of its tries: the schedule
``grpcclient.call`` keeps (each try to its deadline, the doubling pauses between an
idempotent call's tries) is the one ``unanswered_s`` reports, which the simulator times an
unreachable agent's dispatch by."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from gpufleet.common import errors, grpcclient


class _Unanswered(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.DEADLINE_EXCEEDED

    def details(self) -> str:
        return "deadline exceeded"

    def trailing_metadata(self) -> tuple[Any, ...]:
        return ()


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_call_no_try_of_which_is_answered_takes_what_unanswered_s_says(
    idempotent: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[float] = []
    monkeypatch.setattr(grpcclient.time, "sleep", waited.append)

    def method(request: object, *, timeout: float) -> object:
        waited.append(timeout)  # each try runs to its deadline
        raise _Unanswered()

    with pytest.raises(errors.GpufleetError) as raised:
        grpcclient.call(method, object(), timeout=5.0, idempotent=idempotent)
    assert raised.value.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert sum(waited) == pytest.approx(grpcclient.unanswered_s(5.0, idempotent=idempotent))
    # Three tries and two pauses (0.2 s, 0.4 s) when idempotent; one try otherwise.
    assert waited == ([5.0, 0.2, 5.0, 0.4, 5.0] if idempotent else [5.0])
