"""An agent that predates StartJobs (during a rolling upgrade the control plane is new first)
answers UNIMPLEMENTED: the client sends one StartJob per attempt instead and reads each
answer — a refusal for its own attempt, a transport failure for the whole call."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.errors import Unavailable
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.v1 import agent_service_pb2, agent_service_pb2_grpc
from tests.support import tls


class OldAgent(agent_service_pb2_grpc.AgentServiceServicer):  # type: ignore[misc]
    """Serves StartJob only: slot 0 is taken, every other slot starts."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def StartJob(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.slot == 0:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "slot 0 is held by attempt other")
        self.started.append(request.attempt_id)
        return agent_service_pb2.AgentServiceStartJobResponse(already_running=False)


@pytest.fixture
def old_agent() -> Iterator[tuple[OldAgent, ServiceServer]]:
    agent = OldAgent()
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                agent_service_pb2_grpc.add_AgentServiceServicer_to_server,
                agent,
                agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
            )
        ],
        max_workers=4,
        transport=tls.stand_in_agent_transport(),
    )
    yield agent, server
    server.stop(0)


def test_an_agent_without_start_jobs_is_sent_one_start_job_per_attempt(
    old_agent: tuple[OldAgent, ServiceServer],
) -> None:
    agent, server = old_agent
    requests = [
        agent_service_pb2.AgentServiceStartJobRequest(attempt_id=a, slot=s) for a, s in (("a", 1), ("b", 0))
    ]
    with AgentClient("m-1", f"127.0.0.1:{server.port}", tls.transport("scheduler")) as client:
        results = client.start_jobs(requests)
        assert [(r.attempt_id, r.code) for r in results] == [
            ("a", 0),
            ("b", grpc.StatusCode.FAILED_PRECONDITION.value[0]),
        ]
        assert "held by attempt other" in results[1].message
        assert agent.started == ["a"]
        # Remembered: the next call goes straight to StartJob.
        assert [r.code for r in client.start_jobs(requests[:1])] == [0]
    assert agent.started == ["a", "a"]


def test_no_agent_at_the_address_fails_the_whole_call() -> None:
    with AgentClient("m-1", "127.0.0.1:1", tls.transport("scheduler"), timeout_s=1.0) as client:
        with pytest.raises(Unavailable):
            client.start_jobs([agent_service_pb2.AgentServiceStartJobRequest(attempt_id="a", slot=1)])
