"""Telemetry for any driver, wrapped from outside so no driver carries it.

Each provider call becomes a span (``provider.<op>``) naming the provider, the machine and,
on failure, the typed error kind; a counter of calls and a histogram of their duration, by
provider, operation and result (``OK`` or the error's kind), let a dashboard show a
stockout wave, an auth failure or a slow cloud without reading logs.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable
from typing import TypeVar

from gpufleet.common import telemetry
from gpufleet.common.metrics.catalog import PROVIDER_CALL_DURATION, PROVIDER_CALLS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.provider_errors import ProviderError
from gpufleet.provisioner.drivers.base import Driver, InstanceInfo, InstanceRef, InstanceSpec

T = TypeVar("T")

_tracer = telemetry.tracer(__name__)


class InstrumentedDriver:
    """A Driver that records a span, a counted result and a duration around every call of
    ``inner``."""

    def __init__(self, inner: Driver, instruments: Instruments = PROCESS) -> None:
        self.inner = inner
        self.provider = inner.provider
        self.deployment_id = inner.deployment_id
        self._calls = instruments.counter(PROVIDER_CALLS)
        self._duration = instruments.histogram(PROVIDER_CALL_DURATION)

    def _call(self, op: str, machine_id: str, fn: Callable[[], T]) -> T:
        attrs = {"gpufleet.provider": self.provider.value, "gpufleet.provider_op": op}
        with _tracer.start_as_current_span(f"provider.{op}", attributes=attrs) as span:
            if machine_id:
                span.set_attribute("gpufleet.machine_id", machine_id)
            t0 = time.perf_counter()
            try:
                result = fn()
            except ProviderError as err:
                span.set_attribute("gpufleet.provider_error", err.kind)
                self._count(op, err.kind, t0)
                raise
            self._count(op, "OK", t0)
            return result

    def _count(self, op: str, result: str, t0: float) -> None:
        # Wall time, not the injected clock's: this measures the call, it decides nothing.
        labels = {"provider": self.provider.value, "operation": op, "result": result}
        self._calls.add(1, labels)
        self._duration.record(time.perf_counter() - t0, labels)

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
