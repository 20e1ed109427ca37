"""Only the machine a caller means may answer at an agent address.

A cloud gives a destroyed machine's address to the next instance it starts. Before each
caller named the machine it dials, any machine's certificate was accepted: a probe of the
old machine answered by the new one kept the old one looking alive, and a job dispatched to
it would have run where no record said. Each caller (the fleet tick's dispatch, the boot
net's probe, the idle scanner's sample, the job log) goes through ``AgentClient``, which
now checks the serving certificate names the machine it was asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from gpufleet.common.clients.agent import AgentClient, AgentClients
from gpufleet.common.errors import Unavailable
from gpufleet.reaper.agent_probe import GrpcAgentProber
from gpufleet.reaper.idle_scanner import GrpcAgentSampler
from gpufleet.v1 import agent_service_pb2
from tests.support import tls
from tests.support.scripted_services import ScriptedAgent, serve_agent


@pytest.fixture
def new_machine() -> Iterator[ScriptedAgent]:
    """The agent of machine ``m-new``, now at the address ``m-old`` had."""
    with serve_agent(transport=tls.transport("machine:m-new")) as agent:
        yield agent


def start(attempt_id: str) -> agent_service_pb2.AgentServiceStartJobRequest:
    return agent_service_pb2.AgentServiceStartJobRequest(request_id=attempt_id, attempt_id=attempt_id)


def test_a_dispatch_to_the_old_machine_never_reaches_the_new_one(new_machine: ScriptedAgent) -> None:
    agents = AgentClients(
        lambda machine_id, address: AgentClient(machine_id, address, tls.transport("scheduler"))
    )
    try:
        with pytest.raises(Unavailable):
            agents.get("m-old", new_machine.address).start_job(start("a-old"))
        assert new_machine.started == []
        # The machine that is there is served, on a channel of its own.
        agents.get("m-new", new_machine.address).start_job(start("a-new"))
        assert new_machine.started == ["a-new"]
    finally:
        agents.close()


def test_the_old_machine_is_not_probed_alive_by_the_new_one(new_machine: ScriptedAgent) -> None:
    prober = GrpcAgentProber(tls.transport("reaper"), timeout_s=5.0)
    assert prober.probe("m-old", new_machine.address) is None
    answer = prober.probe("m-new", new_machine.address)
    assert answer is not None and answer.healthy


def test_the_new_machine_is_not_sampled_for_the_old_one(new_machine: ScriptedAgent) -> None:
    sampler = GrpcAgentSampler(tls.transport("reaper"), window=timedelta(0), timeout_s=5.0)
    try:
        assert sampler.sample("m-old", new_machine.address) is None
        assert sampler.sample("m-new", new_machine.address) is not None
    finally:
        sampler.clients.close()


def test_a_job_log_is_read_only_from_the_machine_that_ran_it(new_machine: ScriptedAgent) -> None:
    with AgentClient("m-old", new_machine.address, tls.transport("scheduler")) as old:
        with pytest.raises(Unavailable):
            old.read_job_log("a-1", 0, 1024)
