"""The retry policy on every client channel names exactly the unary calls of the services
the client speaks, and nothing a retry could do twice."""

from __future__ import annotations

import json

from gpufleet.client.service_config import IDEMPOTENT_METHODS, channel_options, service_config
from gpufleet.v1 import catalog_service_pb2, job_service_pb2, workspace_service_pb2


def unary_methods(service: object) -> set[str]:
    return {m.name for m in service.methods if not (m.client_streaming or m.server_streaming)}  # type: ignore[attr-defined]


SERVICES = {
    "gpufleet.v1.JobService": job_service_pb2.DESCRIPTOR.services_by_name["JobService"],
    "gpufleet.v1.WorkspaceService": workspace_service_pb2.DESCRIPTOR.services_by_name["WorkspaceService"],
    "gpufleet.v1.CatalogService": catalog_service_pb2.DESCRIPTOR.services_by_name["CatalogService"],
}


def test_every_unary_method_is_retried_and_watch_is_not() -> None:
    config = json.loads(service_config())
    (method_config,) = config["methodConfig"]
    named: dict[str, set[str]] = {}
    for name in method_config["name"]:
        named.setdefault(name["service"], set()).add(name["method"])
    # Each a real method of its service (a typo would silently retry nothing)...
    assert named == {service: unary_methods(SERVICES[service]) for service in SERVICES}
    assert named == {s: set(m) for s, m in IDEMPOTENT_METHODS.items()}
    # ...and the stream left to the watch iterators.
    assert "WatchJob" not in named["gpufleet.v1.JobService"]


def test_only_unavailable_is_retried_and_throttled() -> None:
    config = json.loads(service_config())
    policy = config["methodConfig"][0]["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert policy["maxAttempts"] == 5
    assert config["retryThrottling"]["maxTokens"] > 0


def test_channel_options_enable_retries_and_check_the_servers_name() -> None:
    options = dict(channel_options("scheduler.gpufleet.local"))
    assert options["grpc.enable_retries"] == 1
    assert json.loads(options["grpc.service_config"]) == json.loads(service_config())
    assert options["grpc.ssl_target_name_override"] == "scheduler.gpufleet.local"
    assert "grpc.ssl_target_name_override" not in dict(channel_options(None))
