"""Python enums for the states stored in the database.

Values are the proto enum names without their prefix (``READY`` for
``MACHINE_STATE_READY``), stored as strings so a row reads well in ``psql``.
"""

from __future__ import annotations

from enum import StrEnum


class MachineState(StrEnum):
    # No REQUESTED: a machine is recorded straight into PROVISIONING (intent first); the
    # proto keeps MACHINE_STATE_REQUESTED only for wire compatibility.
    PROVISIONING = "PROVISIONING"
    BOOTING = "BOOTING"
    READY = "READY"
    DRAINING = "DRAINING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    STARTING = "STARTING"
    DESTROYING = "DESTROYING"
    DESTROYED = "DESTROYED"


TRANSITIONAL_STATES = frozenset(
    {MachineState.PROVISIONING, MachineState.STARTING, MachineState.STOPPING, MachineState.DESTROYING}
)
# Machines whose instance is (or should be) up and billing.
RUNNING_STATES = frozenset({MachineState.BOOTING, MachineState.READY, MachineState.DRAINING})


class MachineIntent(StrEnum):
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"
    DESTROYED = "DESTROYED"


class MachineOrigin(StrEnum):
    PROVISIONED = "PROVISIONED"
    REGISTERED = "REGISTERED"


class WorkloadClass(StrEnum):
    REPORTING = "REPORTING"
    SILENT = "SILENT"


class Provider(StrEnum):
    GCP = "GCP"
    AWS = "AWS"
    LOCAL = "LOCAL"
    SIM = "SIM"


class CapacityType(StrEnum):
    SPOT = "SPOT"
    ON_DEMAND = "ON_DEMAND"


class JobState(StrEnum):
    QUEUED = "QUEUED"
    DISPATCHING = "DISPATCHING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT})


class AttemptState(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    LOST = "LOST"
    TIMED_OUT = "TIMED_OUT"
    CANCELLED = "CANCELLED"
    INFRA_ERROR = "INFRA_ERROR"


LIVE_ATTEMPT_STATES = frozenset({AttemptState.STARTING, AttemptState.RUNNING})


class LedgerOutcome(StrEnum):
    NOTHING = "NOTHING"
    RETRY_SAME_MACHINE = "RETRY_SAME_MACHINE"
    FAIL_JOB = "FAIL_JOB"
    REPLACE_MACHINE = "REPLACE_MACHINE"
    STOP_HARDWARE_CONFIG = "STOP_HARDWARE_CONFIG"
    HALT_PROVISIONING = "HALT_PROVISIONING"
    ALERT_HUMAN = "ALERT_HUMAN"


class IncidentState(StrEnum):
    OPEN = "OPEN"
    ACKNOWLEDGED = "ACKNOWLEDGED"
    # Over: what it was about has passed (a paid job's wait ended).
    RESOLVED = "RESOLVED"


class QuarantineKind(StrEnum):
    OFFERING = "OFFERING"
    PROVIDER_REGION = "PROVIDER_REGION"
