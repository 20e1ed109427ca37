"""Instruments a test reads back: strict, on a MeterProvider of the test's own with an
in-memory reader, so nothing touches the process's global provider."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gpufleet.common.metrics.instruments import Instruments

# A series: its labels, as sorted (key, value) pairs.
Series = tuple[tuple[str, str], ...]


class MetricsProbe:
    """``instruments`` to hand to the component under test; ``series(name)`` what it
    recorded (each collection reads the cumulative values so far)."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.instruments = Instruments(self.provider, strict=True)

    def points(self, name: str) -> dict[Series, Any]:
        """Each series of metric ``name``: its data point (a sum's or gauge's ``value``, a
        histogram's ``count``, ``sum``, ``explicit_bounds``)."""
        data = self.reader.get_metrics_data()
        found: dict[Series, Any] = {}
        for rm in data.resource_metrics if data is not None else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            labels = tuple(sorted((k, str(v)) for k, v in (point.attributes or {}).items()))
                            found[labels] = point
        return found

    def series(self, name: str) -> dict[Series, float]:
        """Each series' value: a sum's or gauge's value, a histogram's count."""
        return {
            labels: point.count if hasattr(point, "count") else point.value
            for labels, point in self.points(name).items()
        }

    def value(self, name: str, **labels: str) -> float:
        """The value of the one series with exactly ``labels`` (0 when there is none)."""
        return self.series(name).get(tuple(sorted(labels.items())), 0)

    def close(self) -> None:
        self.provider.shutdown()
