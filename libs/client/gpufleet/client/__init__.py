"""The Python client of gpufleet's API for a product backend.

    from gpufleet.client import Client

    with Client("scheduler.example:50051", "certs/backend") as fleet:
        job = fleet.submit_job("studio-7", "clip", tenant_values={"topic": "otters"})
        for event in fleet.watch_job(job.job_id):
            print(event.state, event.message)

:class:`Client` blocks; :class:`AsyncClient` is the same over asyncio. Answers are the
generated ``gpufleet.v1`` messages; failures are the typed errors of
:mod:`gpufleet.client.errors`. docs/client.md has more examples.
"""

from gpufleet.client.aio_client import AsyncClient
from gpufleet.client.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    GpufleetApiError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from gpufleet.client.sync_client import Client

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Client",
    "DeadlineExceeded",
    "FailedPrecondition",
    "FieldViolation",
    "GpufleetApiError",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "ResourceExhausted",
    "Unauthenticated",
    "Unavailable",
]
