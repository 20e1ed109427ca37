"""The authorization table against the contracts: every method of every gpufleet service
has a rule, no rule names a method that does not exist, and the decision is the table's."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from google.protobuf.descriptor import FileDescriptor

from gpufleet.common.errors import PermissionDenied
from gpufleet.common.trust import authz
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.v1 import job_service_pb2

PROTOS = Path(job_service_pb2.__file__).parent
# Every service contract there is: each *_service.proto's generated module, found by name,
# so a new service file is checked the day it is added.
CONTRACTS: list[FileDescriptor] = [
    importlib.import_module(f"gpufleet.v1.{proto.stem}_pb2").DESCRIPTOR
    for proto in sorted(PROTOS.glob("*_service.proto"))
]


def every_method() -> list[str]:
    return sorted(
        f"/{service.full_name}/{method.name}"
        for contract in CONTRACTS
        for service in contract.services_by_name.values()
        for method in service.methods
    )


def test_every_method_of_every_contract_has_a_rule() -> None:
    missing = [m for m in every_method() if m not in authz.RULES]
    assert not missing, f"methods without an authorization rule: {missing}"


def test_no_rule_names_a_method_that_does_not_exist() -> None:
    known = (
        set(every_method())
        | set(authz.HEALTH_METHODS)
        | {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"}
    )
    assert not set(authz.RULES) - known


def test_every_service_file_was_found() -> None:
    assert len(CONTRACTS) >= 9 and all(c.services_by_name for c in CONTRACTS)


def ident(who: str) -> Identity:
    return Identity.parse(who, "local")


@pytest.mark.parametrize(
    ("method", "who", "allowed"),
    [
        ("/gpufleet.v1.ProvisionerService/CreateInstance", "scheduler", True),
        ("/gpufleet.v1.ProvisionerService/DestroyInstance", "reaper", True),
        ("/gpufleet.v1.ProvisionerService/ListInstances", "sweeper", True),
        ("/gpufleet.v1.ProvisionerService/CreateInstance", "backend", False),
        ("/gpufleet.v1.ProvisionerService/CreateInstance", "operator", False),
        ("/gpufleet.v1.ProvisionerService/CreateInstance", "machine:m-1", False),
        ("/gpufleet.v1.AgentService/StartJob", "scheduler", True),
        ("/gpufleet.v1.AgentService/SampleUtilization", "reaper", True),
        ("/gpufleet.v1.AgentService/StartJob", "operator", False),
        ("/gpufleet.v1.AgentService/StartJob", "machine:m-2", False),
        ("/gpufleet.v1.AgentService/Probe", "sweeper", False),
        ("/gpufleet.v1.WorkerService/ReportHeartbeat", "machine:m-1", True),
        ("/gpufleet.v1.WorkerService/ReportHeartbeat", "scheduler", False),
        ("/gpufleet.v1.WorkerService/RegisterMachine", "operator", False),
        ("/gpufleet.v1.JobService/SubmitJob", "backend", True),
        ("/gpufleet.v1.JobService/SubmitJob", "operator", True),
        ("/gpufleet.v1.JobService/SubmitJob", "machine:m-1", False),
        ("/gpufleet.v1.WorkspaceService/GetUsage", "backend", True),
        ("/gpufleet.v1.FleetService/ListMachines", "operator", True),
        ("/gpufleet.v1.FleetService/ListMachines", "backend", False),
        ("/gpufleet.v1.ReaperService/ListLedgerEntries", "operator", True),
        ("/gpufleet.v1.ReaperService/ListLedgerEntries", "backend", False),
        ("/gpufleet.v1.SweeperService/RunSweep", "operator", True),
        ("/gpufleet.v1.SweeperService/RunSweep", "sweeper", False),
        ("/gpufleet.v1.TokenService/CheckToken", "gateway", True),
        ("/gpufleet.v1.TokenService/CheckToken", "backend", False),
        ("/grpc.health.v1.Health/Check", "machine:m-1", True),
    ],
)
def test_who_may_call_what(method: str, who: str, allowed: bool) -> None:
    decision = authz.decide(method, ident(who))
    assert decision.allowed is allowed
    if not allowed:
        assert decision.verdict is authz.Verdict.WRONG_ROLE
        assert who.split(":")[0] in decision.reason and method in decision.reason


def test_a_method_without_a_rule_is_refused_to_everyone() -> None:
    for role in Role:
        who = "machine:m-1" if role is Role.MACHINE else role.value
        decision = authz.decide("/gpufleet.v1.JobService/DropAllTables", ident(who))
        assert decision.verdict is authz.Verdict.NO_RULE


def test_a_machine_acts_only_for_itself() -> None:
    authz.require_self(ident("machine:m-1"), "m-1")
    with pytest.raises(PermissionDenied) as caught:
        authz.require_self(ident("machine:m-1"), "m-2")
    assert caught.value.field == "machine_id"
