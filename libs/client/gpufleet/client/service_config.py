"""Which calls gRPC itself retries, and the channel options every client channel gets.

Retries are gRPC's own (a service config's ``retryPolicy``, with ``grpc.enable_retries``):
it retries an attempt that ended UNAVAILABLE — the scheduler restarting, a connection cut
before the answer came — with jittered exponential back-off, never past the call's
deadline, and never once any part of an answer has arrived. A retry throttle stops the
retries when most attempts to a server fail, so a scheduler that is down is not hammered.

A call is listed here only when repeating it cannot do something twice:

- reads;
- SubmitJob and CreateWorkspace, idempotent by their ``request_id``: the client fills it in
  once per call, and a retry resends the same bytes, so the same key;
- CancelJob and UpdateWorkspace, idempotent by their nature (a repeat answers the state the
  first left).

WatchJob is not: a stream that has delivered events cannot be retried by gRPC, and the
watch iterators reopen it themselves from the last event they gave. A method not listed —
one added to a service later — is tried once until someone decides it is safe to repeat.
"""

from __future__ import annotations

import json
from typing import Any

RETRYABLE_CODES = ("UNAVAILABLE",)

# Service -> the methods gRPC may retry (see the module's docstring for why each is safe).
IDEMPOTENT_METHODS: dict[str, tuple[str, ...]] = {
    "gpufleet.v1.JobService": ("SubmitJob", "GetJob", "ListJobs", "CancelJob", "GetJobLog"),
    "gpufleet.v1.WorkspaceService": (
        "CreateWorkspace",
        "GetWorkspace",
        "ListWorkspaces",
        "UpdateWorkspace",
        "GetUsage",
    ),
    "gpufleet.v1.CatalogService": ("ListPools", "ListJobKinds", "ListPlans"),
}

# gRPC caps maxAttempts at 5. Back-off before attempt n is random in [0, min(0.25 s * 2^(n-2), 4 s)].
RETRY_POLICY: dict[str, Any] = {
    "maxAttempts": 5,
    "initialBackoff": "0.25s",
    "maxBackoff": "4s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": list(RETRYABLE_CODES),
}

# Each failed attempt costs a token, each success gives back 0.2; below half of maxTokens
# gRPC stops retrying (first attempts still go) until successes refill the bucket.
RETRY_THROTTLING = {"maxTokens": 20, "tokenRatio": 0.2}

# How soon a lost connection is dialled again (gRPC's defaults grow to 120 s: a backend
# would wait that long for a scheduler that restarted in two).
INITIAL_RECONNECT_BACKOFF_MS = 250
MAX_RECONNECT_BACKOFF_MS = 5_000


def service_config() -> str:
    """The service config JSON of every client channel."""
    names = [
        {"service": service, "method": method}
        for service, methods in IDEMPOTENT_METHODS.items()
        for method in methods
    ]
    config = {
        "methodConfig": [{"name": names, "retryPolicy": RETRY_POLICY}],
        "retryThrottling": RETRY_THROTTLING,
    }
    return json.dumps(config)


def channel_options(server_name: str | None) -> list[tuple[str, Any]]:
    """The options of a channel to the scheduler; ``server_name`` is what its TLS
    certificate must carry (None: a plaintext development channel)."""
    options: list[tuple[str, Any]] = [
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config()),
        # Ours, not one a DNS TXT record could swap in.
        ("grpc.service_config_disable_resolution", 1),
        ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]
    if server_name is not None:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options
