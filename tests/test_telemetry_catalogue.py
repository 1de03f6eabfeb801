"""The catalogue, the docs and the exposition stay in sync; an exact /metrics golden."""

import urllib.request
from dataclasses import replace

import numpy as np
import pytest
from opentelemetry.sdk.metrics import Histogram
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult

from grpo_sentinel.telemetry import catalogue
from grpo_sentinel.telemetry.otel import OTelSink
from grpo_sentinel.telemetry.schema import RunInfo, Samples, Scales, StepStats
from helpers import wait_for

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)


def fixed_step() -> StepStats:
    # One group of 4: rewards [1, 1, 0, 0] -> advantages +-0.8659 (MISSION golden), lengths 2, 2, 3, 6.
    a = 0.5 / (np.sqrt(1 / 3) + 1e-4)
    samples = Samples(reward=np.array([1.0, 1, 0, 0]), components={"correct": np.array([1.0, 1, 0, 0])},
                      advantage=np.array([a, a, -a, -a]), correct=np.array([True, True, False, False]),
                      length=np.array([2.0, 2, 3, 6]), truncated=np.array([False, False, False, True]),
                      kl=np.array([0.0, 0.004, 0.03, 0.3]), entropy=np.array([0.1, 0.2, 0.5, 1.0]),
                      group_reward_std=np.array([np.sqrt(1 / 3)]))
    return StepStats(step=7, reward=0.5, kl=0.0835, loss=-0.25, entropy=0.45, entropy_norm=0.45 / np.log(15),
                     adv_mean=0.0, adv_std=0.9998, frac_zero_std=0.0, frac_zero_std_correct=0.0,
                     frac_zero_std_wrong=0.0, train_acc=0.5, response_len=3.25, response_len_correct=2.0,
                     response_len_wrong=4.5, truncation_rate=0.25, repetition=0.125, clip_frac=0.0, grad_norm=0.5, lr=1e-3,
                     step_time=0.2, tokens_per_s=65.0, invalid_rewards=0, reward_components={"correct": 0.5},
                     samples=samples)


def scrape_after(steps: list[StepStats]) -> str:
    sink = OTelSink(("127.0.0.1", 0))
    sink.start(RunInfo("golden", "demo", "grpo", Scales(max_reward=1.0, ln_vocab=float(np.log(15)), max_new_tokens=6)))
    for s in steps:
        sink.on_step(s)
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{sink.prometheus_port}/metrics").read().decode()
    finally:
        sink.close()


def lines_of(text: str, name: str) -> list[str]:
    """Sample lines of one metric, with the otel_scope labels and the run id (every series carries
    run_id="golden": asserted) stripped for readability."""
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            labels, _, value = line.rpartition(" ")
            assert 'run_id="golden"' in labels, line
            kept = [kv for kv in labels[labels.find("{") + 1:-1].split(",")
                    if kv and not kv.startswith("otel_scope") and kv != 'run_id="golden"']
            out.append(f"{line[:line.find('{')] if '{' in line else labels}{{{','.join(kept)}}} {value}")
    return out


class Captured(MetricExporter):
    """Keeps what each push carried: (count, sum, bucket counts) of `grpo.reward`'s one series."""

    def __init__(self, temporality: AggregationTemporality):
        super().__init__(preferred_temporality={Histogram: temporality})
        self.rewards: list[tuple[int, float, tuple[int, ...]]] = []

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        for rm in metrics_data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "grpo.reward":
                        (p,) = m.data.data_points
                        self.rewards.append((p.count, p.sum, tuple(p.bucket_counts)))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass


INFO = RunInfo("golden", "demo", "grpo", Scales(max_reward=1.0, ln_vocab=float(np.log(15)), max_new_tokens=6))
# rewards [1, 1, 0, 0] a step, buckets 0.1 .. 1.0: two values in (-inf, 0.1], two in (0.9, 1.0]
ONE_STEP = (4, 2.0, (2, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0))


def scrape(sink: OTelSink, name: str) -> list[str]:
    return lines_of(urllib.request.urlopen(f"http://127.0.0.1:{sink.prometheus_port}/metrics").read().decode(), name)


def test_prometheus_and_the_otlp_push_export_the_same_histograms():
    """With both ways out, Prometheus's scrape and the OTLP push read one aggregation (one reader: each
    value is aggregated once), cumulative for both."""
    otlp = Captured(AggregationTemporality.CUMULATIVE)
    sink = OTelSink(("127.0.0.1", 0), otlp, export_interval_s=3600)  # pushed below, and at close
    sink.start(INFO)
    try:
        for _ in range(2):
            sink.on_step(fixed_step())
            sink.provider.force_flush()
        assert scrape(sink, "grpo_reward_count") == ["grpo_reward_count{} 8.0"]
        assert scrape(sink, "grpo_reward_sum") == ["grpo_reward_sum{} 4.0"]
    finally:
        sink.close()
    two_steps = (8, 4.0, tuple(2 * c for c in ONE_STEP[2]))
    assert otlp.rewards == [ONE_STEP, two_steps, two_steps]  # the last push: at close


def test_the_otlp_push_runs_every_interval_beside_prometheus():
    otlp = Captured(AggregationTemporality.CUMULATIVE)
    sink = OTelSink(("127.0.0.1", 0), otlp, export_interval_s=0.02)
    sink.start(INFO)
    try:
        sink.on_step(fixed_step())
        assert wait_for(lambda: ONE_STEP in otlp.rewards, timeout=10)
    finally:
        sink.close()


def test_a_step_whose_recording_fails_is_logged_and_training_goes_on(caplog):
    """Recording runs on the training thread: whatever goes wrong in it is logged, never raised, and the next
    step is recorded as usual."""
    sink = OTelSink(("127.0.0.1", 0))
    sink.start(INFO)
    real_add, calls = sink._histograms.add, []

    def add_failing_once(*args):
        calls.append(args)
        if len(calls) == 1:
            raise RuntimeError("boom")
        real_add(*args)

    sink._histograms.add = add_failing_once
    try:
        sink.on_step(fixed_step())  # must not raise
        assert "recording step 7 metrics failed" in caplog.text
        sink.on_step(replace(fixed_step(), step=8))
        assert scrape(sink, "grpo_reward_count") == ["grpo_reward_count{} 4.0"]  # step 8's four rewards only
    finally:
        sink.close()


def test_an_exporter_that_prefers_delta_gets_deltas_beside_prometheus():
    """Its own periodic reader: each push carries what is new since the last, the scrape the total."""
    otlp = Captured(AggregationTemporality.DELTA)
    sink = OTelSink(("127.0.0.1", 0), otlp, export_interval_s=0.02)
    sink.start(INFO)
    try:
        for k in (1, 2):
            sink.on_step(fixed_step())
            assert wait_for(lambda: sum(r[0] for r in otlp.rewards) == 4 * k, timeout=10)
        assert scrape(sink, "grpo_reward_count") == ["grpo_reward_count{} 8.0"]
    finally:
        sink.close()
    assert max(r[0] for r in otlp.rewards) <= 4  # never the running total
    assert tuple(map(sum, zip(*(r[2] for r in otlp.rewards)))) == tuple(2 * c for c in ONE_STEP[2])


def test_exposition_golden():
    text = scrape_after([fixed_step(), fixed_step()])  # two identical steps: counts double
    # rewards [1,1,0,0] twice: two 0s in every bucket, the 1s only from le=1.0; sum 4, count 8
    assert lines_of(text, "grpo_reward_bucket") == [
        f'grpo_reward_bucket{{le="{le}"}} {n}' for le, n in
        [("0.1", "4.0"), ("0.2", "4.0"), ("0.3", "4.0"), ("0.4", "4.0"), ("0.5", "4.0"), ("0.6", "4.0"),
         ("0.7", "4.0"), ("0.8", "4.0"), ("0.9", "4.0"), ("1.0", "8.0"), ("+Inf", "8.0")]]
    assert lines_of(text, "grpo_reward_sum") == ["grpo_reward_sum{} 4.0"]
    assert lines_of(text, "grpo_reward_count") == ["grpo_reward_count{} 8.0"]
    # lengths: correct [2, 2] and wrong [3, 6] per step; buckets 1..6 for max_new_tokens = 6
    assert lines_of(text, "grpo_completion_length_bucket")[:7] == [
        f'grpo_completion_length_bucket{{correct="true",le="{le}"}} {n}' for le, n in
        [("1.0", "0.0"), ("2.0", "4.0"), ("3.0", "4.0"), ("4.0", "4.0"), ("5.0", "4.0"), ("6.0", "4.0"), ("+Inf", "4.0")]]
    assert lines_of(text, "grpo_completion_length_sum") == [
        'grpo_completion_length_sum{correct="true"} 8.0', 'grpo_completion_length_sum{correct="false"} 18.0']
    # |A| = 0.8659 for all four: in the le=1.0 bucket
    assert 'grpo_advantage_abs_bucket{le="0.75"} 0.0' in lines_of(text, "grpo_advantage_abs_bucket")
    assert 'grpo_advantage_abs_bucket{le="1.0"} 8.0' in lines_of(text, "grpo_advantage_abs_bucket")
    # signed values as gauges, exactly as given
    assert lines_of(text, "grpo_loss") == ["grpo_loss{} -0.25"]
    assert lines_of(text, "grpo_repetition_rate") == ["grpo_repetition_rate{} 0.125"]
    assert lines_of(text, "grpo_frac_zero_std") == [
        'grpo_frac_zero_std{outcome="any"} 0.0', 'grpo_frac_zero_std{outcome="all_correct"} 0.0',
        'grpo_frac_zero_std{outcome="all_wrong"} 0.0']
    assert lines_of(text, "grpo_steps_total") == ["grpo_steps_total{} 2.0"]
    assert lines_of(text, "grpo_tokens_total") == ["grpo_tokens_total{} 26.0"]  # (2+2+3+6) * 2


def test_negative_and_nonfinite_histogram_values_are_counted_not_lost():
    s = fixed_step()
    s.samples.kl[0] = -0.5  # impossible for k3, but a custom signal could be signed
    s.samples.entropy[1] = np.nan
    text = scrape_after([s])
    rejected = lines_of(text, "grpo_histogram_rejected_total")
    assert 'grpo_histogram_rejected_total{metric="grpo.kl",reason="negative"} 1.0' in rejected
    assert 'grpo_histogram_rejected_total{metric="grpo.entropy",reason="nonfinite"} 1.0' in rejected
    assert lines_of(text, "grpo_kl_count") == ["grpo_kl_count{} 3.0"]


def test_a_trainer_that_logs_only_means_exports_only_what_it_measured():
    """A record without per-completion values (TRL unwrapped) and with signals nobody measured: every row
    that reads them is absent, none reports a placeholder (no rejected or non-finite count for it)."""
    s = StepStats.partial(3, reward=0.5, loss=0.1, steps_in_row=2)
    assert s.samples is None and "entropy" in s.unmeasured and "reward" not in s.unmeasured
    points = {m.name: list(m.points(s)) for m in catalogue.CATALOGUE}
    assert all(points[m.name] == [] for m in catalogue.CATALOGUE if m.kind == "histogram")
    assert points["grpo.steps"] == [(2.0, {})] and points["grpo.completions"] == []
    assert catalogue.nonfinite_signals(s) == []
    text = scrape_after([s])
    counted = lines_of(text, "grpo_histogram_rejected_total") + lines_of(text, "grpo_nonfinite_total")
    assert counted and all(line.endswith(" 0.0") for line in counted) and "grpo_reward_mean{" in text
    # Per-completion values without a verifier's verdict or a KL: lengths kept, their split unknown, no KL histogram.
    x = fixed_step().samples
    unjudged = StepStats.partial(4, reward=0.5, samples=Samples(**{**x.__dict__, "unmeasured": frozenset({"kl", "correct"})}))
    by_name = {m.name: list(m.points(unjudged)) for m in catalogue.CATALOGUE}
    assert by_name["grpo.kl"] == [] and {a["correct"] for _, a in by_name["grpo.completion.length"]} == {"unknown"}


def test_a_condition_is_exported_at_the_severity_it_is_at_now():
    """A drift row's warning escalates to critical (detectors._escalate), nonfinite is a warning before it is
    critical: the gauge moves the condition from its warning series to its critical one, so the dashboard's
    count of critical conditions (severity="critical") sees an escalated warning; the episode counter labels
    an episode with the severity it began at."""

    sink = OTelSink(("127.0.0.1", 0))
    sink.start(RunInfo("golden", "demo", "grpo", Scales(max_reward=1.0, ln_vocab=float(np.log(15)), max_new_tokens=6)))

    def condition_lines(**health) -> list[str]:
        sink.on_step(replace(fixed_step(), **health))
        text = urllib.request.urlopen(f"http://127.0.0.1:{sink.prometheus_port}/metrics").read().decode()
        return [ln for ln in lines_of(text, "grpo_health_condition") + lines_of(text, "grpo_health_episodes_total")
                if "length_drift" in ln or "nonfinite" in ln or 'condition="kl_runaway"' in ln]

    try:
        warning = condition_lines(health=("length_drift", "nonfinite"), health_new=("length_drift", "nonfinite"))
        critical = condition_lines(health=("length_drift", "nonfinite", "kl_runaway"), health_new=("kl_runaway",),
                                   health_critical=("length_drift", "nonfinite", "kl_runaway"))
        over = condition_lines()
    finally:
        sink.close()
    gauge = 'grpo_health_condition{{condition="{}",severity="{}"}} {}'
    episodes = 'grpo_health_episodes_total{{condition="{}",severity="{}"}} {}'
    assert sorted(warning) == sorted([
        gauge.format("length_drift", "warning", "1.0"), gauge.format("length_drift", "critical", "0.0"),
        gauge.format("nonfinite", "warning", "1.0"), gauge.format("nonfinite", "critical", "0.0"),
        gauge.format("kl_runaway", "critical", "0.0"),  # a row with one severity has one series
        episodes.format("length_drift", "warning", "1.0"), episodes.format("length_drift", "critical", "0.0"),
        episodes.format("nonfinite", "warning", "1.0"), episodes.format("nonfinite", "critical", "0.0"),
        episodes.format("kl_runaway", "critical", "0.0")])
    assert sorted(critical) == sorted([
        gauge.format("length_drift", "warning", "0.0"), gauge.format("length_drift", "critical", "1.0"),
        gauge.format("nonfinite", "warning", "0.0"), gauge.format("nonfinite", "critical", "1.0"),
        gauge.format("kl_runaway", "critical", "1.0"),
        # escalating is not a new episode: the counter keeps the one that began as a warning
        episodes.format("length_drift", "warning", "1.0"), episodes.format("length_drift", "critical", "0.0"),
        episodes.format("nonfinite", "warning", "1.0"), episodes.format("nonfinite", "critical", "0.0"),
        episodes.format("kl_runaway", "critical", "1.0")])
    assert [ln for ln in over if ln.startswith("grpo_health_condition") and ln.endswith(" 1.0")] == []


def test_every_severity_a_detector_reports_a_row_at_is_one_of_its_exported_stages():
    from grpo_sentinel.telemetry.health.detectors import ESCALATING, FORECASTING
    from grpo_sentinel.telemetry.health.rules import TRAINER_SIDE
    from grpo_sentinel.telemetry.health.table import TABLE
    staged = {r.id for r in TABLE if r.severity == "warning" and "critical" in r.severities}
    # Drift rows escalate or forecast (detectors._escalate, _forecast); the others' critical stage is the trainer's
    # verdict at that severity, which their rule reads (rules.health_rules).
    assert {*ESCALATING, *FORECASTING} <= staged, "Row.stages names every drift row with a critical stage"
    assert staged - {*ESCALATING, *FORECASTING} <= set(TRAINER_SIDE)


@pytest.mark.parametrize("temporality", [AggregationTemporality.CUMULATIVE, AggregationTemporality.DELTA])
def test_histograms_aggregate_as_the_sdks_explicit_bucket_histogram(temporality):
    """telemetry/histograms.py against the SDK's own aggregation of the same values, collection by collection:
    values on the bounds (upper-inclusive), below the first and above the last, two series, a series that gets
    nothing in an interval."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    from grpo_sentinel.telemetry.histograms import Histograms, Spec

    bounds = (0.1, 0.5, 1.0, 2.0)
    reader = InMemoryMetricReader(preferred_temporality={Histogram: temporality})
    provider = MeterProvider(metric_readers=[reader], views=[
        View(instrument_name="h", aggregation=ExplicitBucketHistogramAggregation(bounds))])
    sdk = provider.get_meter("t").create_histogram("h")
    ours = Histograms({"h": Spec("1", "", bounds)}, delta=temporality is AggregationTemporality.DELTA)
    rng = np.random.default_rng(0)
    on_bounds = np.array(bounds * 3)
    batches = [({"s": "a"}, np.concatenate([on_bounds, rng.exponential(1.0, 40), [0.0, 7.5]])),
               ({"s": "b"}, rng.exponential(0.3, 25)), ({"s": "a"}, rng.exponential(2.0, 10))]

    def points(metrics):
        return {tuple(p.attributes.items()): p for m in metrics if m.name == "h" for p in m.data.data_points}

    for i, collection in enumerate(([batches[0], batches[1]], [batches[2]])):  # b gets nothing in the second
        for attrs, values in collection:
            for v in values:
                sdk.record(float(v), attrs)
            ours.add("h", values, attrs)
        want = points(m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                      for m in sm.metrics)
        got = points(ours.metrics(temporality))
        delta_later = temporality is AggregationTemporality.DELTA and i == 1
        assert set(got) == set(want) and len(want) == (1 if delta_later else 2)
        for key, w in want.items():
            g = got[key]
            assert (g.count, g.bucket_counts, g.explicit_bounds, g.min, g.max) == (
                w.count, tuple(w.bucket_counts), tuple(w.explicit_bounds), w.min, w.max)
            assert g.sum == pytest.approx(w.sum, rel=1e-12)
            assert g.start_time_unix_nano <= g.time_unix_nano
    provider.shutdown()
