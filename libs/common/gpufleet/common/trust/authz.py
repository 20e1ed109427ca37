"""The one authorization table: which role may call which method.

Every service's server enforces it through one interceptor
(:mod:`gpufleet.common.trust.interceptor`); a method with no rule is refused to every
caller, and a test built from the services' descriptors fails until the rule is written.
What a machine may do is narrower still — only for itself — and that check needs the
request, so the servicer makes it (:func:`require_self`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.common.errors import PermissionDenied
from gpufleet.common.trust.identity import Identity, Role

R = Role
_PROVIDER_CALLERS = frozenset({R.SCHEDULER, R.REAPER, R.SWEEPER})
_FRONT_DOOR = frozenset({R.BACKEND, R.OPERATOR})
_OPERATOR = frozenset({R.OPERATOR})
_MACHINE = frozenset({R.MACHINE})
_DRIVES_AGENTS = frozenset({R.SCHEDULER, R.REAPER})
ANY_IDENTITY = frozenset(Role)


def _service(name: str, roles: frozenset[Role], methods: tuple[str, ...]) -> dict[str, frozenset[Role]]:
    return {f"/gpufleet.v1.{name}/{m}": roles for m in methods}


# Full method name -> the roles that may call it.
RULES: Mapping[str, frozenset[Role]] = {
    # The product backend's door; the operator's CLI (submit, jobs, usage) uses it too.
    **_service(
        "JobService", _FRONT_DOOR, ("SubmitJob", "GetJob", "ListJobs", "CancelJob", "WatchJob", "GetJobLog")
    ),
    **_service(
        "WorkspaceService",
        _FRONT_DOOR,
        ("CreateWorkspace", "GetWorkspace", "ListWorkspaces", "UpdateWorkspace", "GetUsage"),
    ),
    # The catalogue, read-only: a backend must know the pools, kinds and plans to build a
    # valid request.
    **_service("CatalogService", _FRONT_DOOR, ("ListPools", "ListJobKinds", "ListPlans")),
    # Operators only: the fleet's machines, the watchdogs, the ledger, the sweeps.
    **_service(
        "FleetService",
        _OPERATOR,
        (
            "ListMachines",
            "GetMachine",
            "CordonMachine",
            "UncordonMachine",
            "DeregisterMachine",
            "ListPools",
            "ListWorkspaces",
            "GetSystemTime",
        ),
    ),
    **_service(
        "ReaperService",
        _OPERATOR,
        (
            "ListWatchdogs",
            "ListLedgerEntries",
            "ListIncidents",
            "AcknowledgeIncident",
            "ListQuarantines",
            "ClearQuarantine",
        ),
    ),
    **_service("SweeperService", _OPERATOR, ("ListSweeps", "ListOrphans", "RunSweep")),
    # Every call to a cloud: only the three parts that decide on machines.
    **_service(
        "ProvisionerService",
        _PROVIDER_CALLERS,
        (
            "CreateInstance",
            "StartInstance",
            "StopInstance",
            "DestroyInstance",
            "GetInstance",
            "ListInstances",
            "ListOfferings",
        ),
    ),
    # A machine's agent takes sessions only from the control plane that drives it.
    **_service(
        "AgentService",
        _DRIVES_AGENTS,
        (
            "Probe",
            "SampleUtilization",
            "StartJob",
            "StartJobs",
            "CancelJob",
            "ListRunners",
            "ReadJobLog",
        ),
    ),
    # What a machine reports, each only for itself (require_self in the servicer).
    **_service(
        "WorkerService",
        _MACHINE,
        (
            "ReportHeartbeat",
            "ReportCompletion",
            "RegisterMachine",
            "PutCheckpointPart",
            "CommitCheckpoint",
            "ReadCheckpoint",
        ),
    ),
    **_service("TokenService", frozenset({R.GATEWAY}), ("CheckToken",)),
    # Any authenticated part may ask after health or list what a server serves.
    "/grpc.health.v1.Health/Check": ANY_IDENTITY,
    "/grpc.health.v1.Health/Watch": ANY_IDENTITY,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": ANY_IDENTITY,
}

HEALTH_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    NO_RULE = "no_rule"  # a method nobody wrote a rule for: refused to everyone
    WRONG_ROLE = "wrong_role"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str

    @property
    def allowed(self) -> bool:
        return self.verdict is Verdict.ALLOWED


def decide(method: str, identity: Identity, rules: Mapping[str, frozenset[Role]] = RULES) -> Decision:
    """May ``identity`` call ``method``? Pure: the table and nothing else."""
    roles = rules.get(method)
    if roles is None:
        return Decision(Verdict.NO_RULE, f"{method} has no authorization rule")
    if identity.role not in roles:
        allowed = ", ".join(sorted(r.value for r in roles))
        return Decision(Verdict.WRONG_ROLE, f"{identity} may not call {method} (allowed: {allowed})")
    return Decision(Verdict.ALLOWED, "")


def require_self(identity: Identity | None, machine_id: str, what: str = "machine_id") -> None:
    """A machine reports only for itself: its certificate's id must be the one it names.
    ``identity`` is None only on a server run insecure for development."""
    if identity is None or identity.role is not Role.MACHINE:
        return
    if identity.machine_id != machine_id:
        raise PermissionDenied(f"{identity} may not act for machine {machine_id!r}", field=what)
