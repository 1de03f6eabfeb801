"""OpenTelemetry sink: every catalogue metric, to a Prometheus `/metrics` endpoint and/or OTLP.

Telemetry must never stop training: recording never raises into the trainer, a dead OTLP
collector costs a counter and a rate-limited warning, and start-up problems that the user can
fix (a port in use) fail loudly before the model loads.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable

import numpy as np
from opentelemetry.context import _SUPPRESS_INSTRUMENTATION_KEY, attach, detach, set_value
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics import Histogram as HistogramInstrument
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from grpo_sentinel.telemetry.catalogue import CATALOGUE, nonfinite_signals
from grpo_sentinel.telemetry.drops import DROPS
from grpo_sentinel.telemetry.histograms import Histograms, Spec, with_histograms
from grpo_sentinel.telemetry.schema import RunInfo, StepStats

log = logging.getLogger(__name__)
SCOPE = InstrumentationScope("grpo_sentinel")  # the meter's: histograms join the SDK's metrics under it


# What the histograms are added to a collection by (OTelSink._with_histograms): (collection, temporality) -> collection
AddHistograms = Callable[[MetricsData | None, AggregationTemporality], MetricsData | None]


class _CountingExporter(MetricExporter):
    """Wraps an exporter: failures are counted, never raised, and said once per change of state (the
    SDK's own per-attempt warnings are silenced: a dead collector would print one every interval). Every
    push gets the histograms (telemetry/histograms.py) added, at the exporter's temporality."""

    def __init__(self, inner: MetricExporter, name: str, on_failure, add_histograms: AddHistograms):
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner, self.name, self.on_failure, self.add_histograms = inner, name, on_failure, add_histograms
        self.temporality = inner._preferred_temporality.get(HistogramInstrument, AggregationTemporality.CUMULATIVE)
        self.failing = False
        self.in_flight_since: float | None = None  # an export that has not returned (a collector that never answers)
        for logger in (
            "opentelemetry.exporter.otlp.proto.http.metric_exporter",
            "opentelemetry.exporter.otlp.proto.grpc.exporter",
            "opentelemetry.exporter.otlp.common.http",
        ):
            logging.getLogger(logger).setLevel(logging.CRITICAL)

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        self.in_flight_since = time.monotonic()
        try:
            metrics_data = self.add_histograms(metrics_data, self.temporality)
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        except Exception as e:  # noqa: BLE001 - an exporter bug must not kill the reader thread
            result, why = MetricExportResult.FAILURE, repr(e)
        else:
            why = "no answer, or an error answer"
        finally:
            self.in_flight_since = None
        if result is not MetricExportResult.SUCCESS:
            self.on_failure(self.name)
            if not self.failing:
                log.warning("metrics export to %s failing (%s); training continues, failures are counted in "
                            "grpo_telemetry_export_failures_total", self.name, why)
            self.failing = True
        elif self.failing:
            log.info("metrics export to %s works again", self.name)
            self.failing = False
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)


class Scraped(PrometheusMetricReader):
    """The Prometheus reader, with the histograms added to every scrape (cumulative, as Prometheus reads)."""

    def __init__(self, registry, add_histograms: AddHistograms):
        super().__init__(registry=registry)
        self._add_histograms = add_histograms

    def _receive_metrics(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> None:
        super()._receive_metrics(self._add_histograms(metrics_data, AggregationTemporality.CUMULATIVE),
                                 timeout_millis, **kwargs)


class ServedAndPushed(Scraped):
    """One reader for both ways out: Prometheus scrapes it, and every `interval_s` (and once at shutdown)
    the same cumulative collection is pushed through `exporter`. The SDK keeps one aggregation per reader,
    so two readers (Prometheus's and a PeriodicExportingMetricReader) would aggregate every gauge and counter
    value twice (docs/benchmarks.md, third round). For an exporter that wants cumulative data, as
    Prometheus does; one that prefers delta gets its own periodic reader."""

    def __init__(self, registry, add_histograms: AddHistograms, exporter: MetricExporter, interval_s: float):
        super().__init__(registry, add_histograms)
        self._exporter, self._interval_s = exporter, interval_s
        self._pushing = threading.local()  # set on a pushing thread: its collections go to the exporter
        self._one_push = threading.Lock()  # an exporter is never called concurrently (the SDK's contract)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ticker, name="grpo-otlp-push", daemon=True)
        self._thread.start()

    def _ticker(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._push()
        self._push()  # the last values, at shutdown

    def _push(self) -> None:
        with self._one_push:
            self._pushing.on = True
            try:
                self.collect()
            except Exception:  # noqa: BLE001 - a failed collection (a timeout) is tried again next interval
                log.exception("collecting metrics for the OTLP push failed")
            finally:
                self._pushing.on = False

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        self._push()  # what the SDK's periodic reader does: export now
        return True

    def _receive_metrics(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> None:
        if not getattr(self._pushing, "on", False):
            return super()._receive_metrics(metrics_data, timeout_millis, **kwargs)  # a scrape
        token = attach(set_value(_SUPPRESS_INSTRUMENTATION_KEY, True))  # as the SDK's reader: the export is not traced
        try:
            self._exporter.export(metrics_data, timeout_millis=timeout_millis)  # which adds the histograms
        finally:
            detach(token)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        deadline = time.monotonic() + timeout_millis / 1000
        self._stop.set()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._exporter.shutdown(timeout_millis=max(0.0, deadline - time.monotonic()) * 1000)
        super().shutdown(timeout_millis, **kwargs)


def otlp_exporter_from_env() -> MetricExporter | None:
    """The standard OTEL_EXPORTER_OTLP_* variables; None when no endpoint is set."""
    if not (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"
    )
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    else:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: use 'grpc' or 'http/protobuf'")
    return OTLPMetricExporter()


class OTelSink:
    """A StepSink. The constructor binds the Prometheus port (so a port in use fails before the model
    loads); `start()` builds the meter provider, whose buckets need the run's scales."""

    def __init__(self, prometheus_addr: tuple[str, int] | None = ("127.0.0.1", 9464),
                 otlp: MetricExporter | None = None, export_interval_s: float = 10.0, linger_s: float = 0.0):
        self.otlp, self.export_interval_s, self.linger_s = otlp, export_interval_s, linger_s
        self.provider: MeterProvider | None = None
        self.export_failures: dict[str, int] = {}
        self._server = self._registry = self._exporter = None
        if prometheus_addr is not None:
            from prometheus_client import CollectorRegistry, start_http_server

            self._registry = CollectorRegistry()  # our own: two runs in one process never collide
            host, port = prometheus_addr
            try:
                self._server, _ = start_http_server(port, addr=host, registry=self._registry)
            except OSError as e:
                raise OSError(f"cannot serve metrics on {host}:{port} ({e.strerror}): set telemetry.prometheus_port "
                              "to a free port, 0 for any, or telemetry.prometheus=false") from None
            log.info("Prometheus metrics on http://%s:%d/metrics", host, self._server.server_port)

    def start(self, info: RunInfo) -> None:
        readers = []
        self._resource = Resource.create({"service.name": "grpo-sentinel", "service.instance.id": info.run_id,
                                          "grpo.run_id": info.run_id, "grpo.model": info.model,
                                          "grpo.loss_type": info.loss_type, "grpo.world_size": info.world_size})
        if self.otlp is not None:
            self._exporter = _CountingExporter(self.otlp, "otlp", self._export_failed, self._with_histograms)
        self._histograms = Histograms({m.name: Spec(m.unit, m.description, tuple(m.buckets(info.scales)))
                                       for m in CATALOGUE if m.kind == "histogram"},
                                      delta=self._exporter is not None
                                      and self._exporter.temporality is AggregationTemporality.DELTA)
        cumulative = self.otlp is not None and all(
            t is AggregationTemporality.CUMULATIVE for t in self.otlp._preferred_temporality.values())
        if self._registry is not None and cumulative:
            readers.append(ServedAndPushed(self._registry, self._with_histograms, self._exporter, self.export_interval_s))
        else:
            if self._registry is not None:
                readers.append(Scraped(self._registry, self._with_histograms))
            if self.otlp is not None:
                readers.append(PeriodicExportingMetricReader(self._exporter,
                                                             export_interval_millis=self.export_interval_s * 1000))
        # No exemplars: nothing here records inside a sampled span, and the filter is a cost on every value.
        self.provider = MeterProvider(metric_readers=readers, resource=self._resource,
                                      exemplar_filter=AlwaysOffExemplarFilter())
        meter = self.provider.get_meter(SCOPE.name)
        make = {"gauge": meter.create_gauge, "counter": meter.create_counter}
        # Every series carries the run id: consecutive runs of one process (the daemon) never share a
        # series, so PromQL windows and the dashboard keep them apart.
        self._run = {"run_id": info.run_id}
        self._instruments = {}
        for m in CATALOGUE:
            if m.observed:  # counted by telemetry itself, read at each collection
                meter.create_observable_counter(m.name, callbacks=[self._observer(m)], unit=m.unit,
                                                description=m.description)
                continue
            if m.kind == "histogram":  # self._histograms
                continue
            self._instruments[m.name] = make[m.kind](m.name, unit=m.unit, description=m.description)
            if m.kind == "counter":
                for attrs in m.initial:
                    self._instruments[m.name].add(0, {**attrs, **self._run})

    def _with_histograms(self, data: MetricsData | None, temporality: AggregationTemporality) -> MetricsData | None:
        return with_histograms(data, self._histograms.metrics(temporality), self._resource, SCOPE)

    def _observer(self, m):
        return lambda options: [Observation(v, {**attrs, **self._run}) for v, attrs in DROPS.observe(m.name, m.initial)]

    @property
    def prometheus_port(self) -> int | None:
        return self._server.server_port if self._server else None

    def on_step(self, s: StepStats) -> None:
        """Records the step on the calling (training) thread: ~60 in-memory SDK calls and a numpy pass per
        histogram series, ~0.5-1 ms, that never wait on the network (exports run on their own threads, after
        collection). A worker thread cost more wall time than it saved: 1.05x against 1.00x over the run
        (docs/benchmarks.md, fifth round), the training thread waiting on the hand-off."""
        if self.provider is None:
            return
        try:
            self._record(s)
        except Exception:  # noqa: BLE001 - telemetry never stops training
            log.exception("recording step %d metrics failed; training continues", s.step)

    def _record(self, s: StepStats) -> None:
        run = self._run
        for m in CATALOGUE:
            if m.observed:
                continue
            if m.kind == "histogram":
                for values, attrs in m.points(s):
                    self._record_histogram(m.name, values, {**attrs, **run})
                continue
            inst = self._instruments[m.name]
            for value, attrs in m.points(s):
                attrs = {**attrs, **run}
                if m.kind == "gauge" and not math.isfinite(value):
                    continue  # a NaN gauge is "not measured" (e.g. KL with beta = 0); nonfinite counts it below
                elif m.kind == "counter":
                    inst.add(value, attrs)
                else:
                    getattr(inst, "record" if m.kind == "histogram" else "set")(value, attrs)
        for signal in nonfinite_signals(s):
            self._instruments["grpo.nonfinite"].add(1, {"signal": signal, **run})
        self._instruments["grpo.step.last_timestamp"].set(time.time(), run)

    def _record_histogram(self, name: str, values: np.ndarray, attrs: dict[str, str]) -> None:
        """A histogram keeps what is finite and >= 0 (the SDK would drop the rest silently); the rest is counted."""
        negative = values < 0  # -inf included; NaN compares False
        nonfinite = ~np.isfinite(values) & ~negative
        for reason, n in (("negative", int(negative.sum())), ("nonfinite", int(nonfinite.sum()))):
            if n:
                self._instruments["grpo.histogram.rejected"].add(n, {"metric": name, "reason": reason, **self._run})
        self._histograms.add(name, values[~(negative | nonfinite)], attrs)

    def _export_failed(self, exporter: str) -> None:
        self.export_failures[exporter] = self.export_failures.get(exporter, 0) + 1
        self._instruments["grpo.telemetry.export_failures"].add(1, {"exporter": exporter, **self._run})

    def close(self) -> None:
        if self.provider is not None:
            if self.linger_s > 0 and self._server is not None:
                time.sleep(self.linger_s)  # let a last scrape see the final step of a short run
            # Bounded: a dead collector must not hold the exit for the exporter's full retry budget.
            self.provider.shutdown(timeout_millis=5_000)
            self.provider = None
            stuck = self._exporter is not None and self._exporter.in_flight_since is not None
            if stuck:
                log.warning("metrics export to otlp still had no answer after %.0f s at shutdown: the collector accepts "
                            "connections but does not respond; the last metrics were not delivered",
                            time.monotonic() - self._exporter.in_flight_since)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
