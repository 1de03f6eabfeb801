"""The catalogue's histograms, aggregated in numpy and handed to the OTel readers as SDK data points.

A demo step has ~460 histogram values (one per completion and metric). Through the SDK's instruments
each is one `record` call (~5.5 us of Python: attribute cleaning, hashing, a lock, a bisect), ~2.5 ms a
step on the telemetry thread, which shares the GIL with training. Here a step's values for one series are
one `searchsorted` and one `bincount`. The SDK has no door for values aggregated elsewhere (no batch
`record`, no MetricProducer in opentelemetry-python 1.45), so the readers add these points to each
collection (`with_histograms`): Prometheus and OTLP see exactly what the SDK's explicit-bucket histogram
would give (the same bounds, upper-inclusive buckets, count, sum, min, max; tests/test_telemetry_catalogue.py
compares the two).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from time import time_ns

import numpy as np
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope


@dataclass
class _Counts:
    """One series' counts since `start` (ns). `buckets[i]` counts values in (bounds[i-1], bounds[i]]."""

    start: int
    buckets: np.ndarray  # int64 [len(bounds) + 1]
    sum: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    def add(self, values: np.ndarray, bounds: np.ndarray) -> None:
        # side="left": a value equal to a bound falls in the bucket it closes, as the SDK's bisect_left
        self.buckets += np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(self.buckets))
        self.sum += float(values.sum())
        self.min, self.max = min(self.min, float(values.min())), max(self.max, float(values.max()))

    def point(self, attrs: dict[str, str], bounds: tuple[float, ...], now: int) -> HistogramDataPoint:
        return HistogramDataPoint(attributes=attrs, start_time_unix_nano=self.start, time_unix_nano=now,
                                  count=int(self.buckets.sum()), sum=self.sum, bucket_counts=tuple(self.buckets.tolist()),
                                  explicit_bounds=bounds, min=self.min, max=self.max)


@dataclass
class _Series:
    attrs: dict[str, str]
    total: _Counts
    delta_start: int  # the last delta collection, or the series' first value if it came after
    since_delta: _Counts | None = None  # the values since delta_start; None: nothing new


@dataclass(frozen=True)
class Spec:
    unit: str
    description: str
    bounds: tuple[float, ...]


@dataclass
class Histograms:
    """Cumulative histograms of the run (by name: `specs`) and, with `delta`, the values since the last
    delta collection too (for an OTLP exporter that prefers delta; one such consumer at most, as the sink
    builds it). Thread-safe: the telemetry worker adds, the readers' threads collect."""

    specs: dict[str, Spec]
    delta: bool = False
    _series: dict[tuple[str, tuple[tuple[str, str], ...]], _Series] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._bounds = {name: np.asarray(spec.bounds) for name, spec in self.specs.items()}

    def add(self, name: str, values: np.ndarray, attrs: dict[str, str]) -> None:
        """Record finite, non-negative `values` (the caller rejects the rest) into the series `attrs`."""
        if not len(values):
            return
        bounds = self._bounds[name]
        key = (name, tuple(sorted(attrs.items())))
        with self._lock:
            now = time_ns()
            series = self._series.get(key)
            if series is None:
                series = self._series[key] = _Series(attrs, self._empty(name, now), delta_start=now)
            series.total.add(values, bounds)
            if self.delta:
                if series.since_delta is None:
                    series.since_delta = self._empty(name, series.delta_start)
                series.since_delta.add(values, bounds)

    def _empty(self, name: str, start: int) -> _Counts:
        return _Counts(start, np.zeros(len(self.specs[name].bounds) + 1, dtype=np.int64))

    def metrics(self, temporality: AggregationTemporality) -> list[Metric]:
        """One SDK Metric per histogram with a series. Cumulative: every series since its first value.
        Delta: what each series got since the previous delta collection (a series with nothing new is
        left out, as the SDK does), and that interval starts again."""
        assert self.delta or temporality is AggregationTemporality.CUMULATIVE, "built without delta"
        now = time_ns()
        points: dict[str, list[HistogramDataPoint]] = {}
        with self._lock:
            for (name, _), series in self._series.items():
                bounds = self.specs[name].bounds
                if temporality is AggregationTemporality.CUMULATIVE:
                    points.setdefault(name, []).append(series.total.point(series.attrs, bounds, now))
                else:  # the next interval starts at this collection, as the SDK's delta points do
                    if series.since_delta is not None:
                        points.setdefault(name, []).append(series.since_delta.point(series.attrs, bounds, now))
                    series.since_delta, series.delta_start = None, now
        return [Metric(name=n, description=self.specs[n].description, unit=self.specs[n].unit,
                       data=Histogram(data_points=ps, aggregation_temporality=temporality))
                for n, ps in points.items()]


def with_histograms(data: MetricsData | None, histograms: list[Metric], resource: Resource,
                    scope: InstrumentationScope) -> MetricsData | None:
    """`data` with `histograms` added to `scope`'s metrics (a scope the collection lacks is added)."""
    if not histograms:
        return data
    resource_metrics = list(data.resource_metrics) if data is not None else []
    for i, rm in enumerate(resource_metrics):
        for j, sm in enumerate(rm.scope_metrics):
            if sm.scope.name == scope.name:
                scopes = list(rm.scope_metrics)
                scopes[j] = replace(sm, metrics=[*sm.metrics, *histograms])
                resource_metrics[i] = replace(rm, scope_metrics=scopes)
                return MetricsData(resource_metrics=resource_metrics)
    ours = ScopeMetrics(scope=scope, metrics=histograms, schema_url="")
    return MetricsData(resource_metrics=[*resource_metrics, ResourceMetrics(resource, [ours], schema_url="")])
