"""Telemetry for any driver, wrapped from outside so no driver carries it.

Each provider call becomes a span (``provider.<op>``) naming the provider, the machine and,
on failure, the typed error kind; a counter of calls by provider, operation and outcome
lets a dashboard show a stockout wave or an auth failure without reading logs.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import TypeVar

from gpufleet.common import telemetry
from gpufleet.common.provider_errors import ProviderError
from gpufleet.provisioner.drivers.base import Driver, InstanceInfo, InstanceRef, InstanceSpec

T = TypeVar("T")

_tracer = telemetry.tracer(__name__)
_calls = telemetry.meter(__name__).create_counter(
    "gpufleet.provisioner.provider_calls", description="Provider calls by provider, operation and outcome"
)


class InstrumentedDriver:
    """A Driver that records a span and a counted outcome around every call of ``inner``."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.deployment_id = inner.deployment_id

    def _call(self, op: str, machine_id: str, fn: Callable[[], T]) -> T:
        attrs = {"gpufleet.provider": self.provider.value, "gpufleet.provider_op": op}
        with _tracer.start_as_current_span(f"provider.{op}", attributes=attrs) as span:
            if machine_id:
                span.set_attribute("gpufleet.machine_id", machine_id)
            try:
                result = fn()
            except ProviderError as err:
                span.set_attribute("gpufleet.provider_error", err.kind)
                _calls.add(1, {**attrs, "outcome": err.kind})
                raise
            _calls.add(1, {**attrs, "outcome": "OK"})
            return result

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        return self._call("create", spec.machine_id, lambda: self.inner.create(spec))

    def start(self, ref: InstanceRef) -> InstanceInfo:
        return self._call("start", ref.machine_id, lambda: self.inner.start(ref))

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        return self._call("stop", ref.machine_id, lambda: self.inner.stop(ref))

    def destroy(self, ref: InstanceRef) -> bool:
        return self._call("destroy", ref.machine_id, lambda: self.inner.destroy(ref))

    def get(self, ref: InstanceRef) -> InstanceInfo:
        return self._call("get", ref.machine_id, lambda: self.inner.get(ref))

    def list(self) -> builtins.list[InstanceInfo]:
        return self._call("list", "", self.inner.list)
