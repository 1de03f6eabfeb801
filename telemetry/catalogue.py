"""The metric catalogue: one row per OpenTelemetry instrument. The OTel sink, docs/metrics.md and
the checks on dashboards and alert rules all derive from this table.

A row says what one recorded value *is* (per completion, per group, per step), where it comes
from in StepStats, and, for histograms, its buckets as a function of the run's scales (rewards
span [0, max reward], entropy [0, ln V], lengths [0, max_new_tokens]).

Why some signals are gauges: the OTel SDK silently drops negative and non-finite values from
histograms. Advantages, the loss and signed rewards are therefore exported as per-step gauges
(mean, std), advantages as a histogram of |A|; a histogram value that is negative or non-finite
is never recorded but counted in `grpo.histogram.rejected{metric, reason}`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from grpo_sentinel.telemetry.health.table import BY_ID, TABLE
from grpo_sentinel.telemetry.schema import Scales, StepStats

Points = Iterable[tuple[float, dict[str, str]]]  # (value, attributes)
# A histogram's points are its series: (the step's values, float64 [n], attributes). The sink aggregates
# a series' values at once (telemetry/histograms.py); one value at a time costs ~5.5 us each in the SDK.
Series = Iterable[tuple[np.ndarray, dict[str, str]]]


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str  # histogram | gauge | counter
    unit: str
    per: str  # what one recorded value is
    description: str
    points: Callable[[StepStats], Points | Series]  # Series for a histogram
    buckets: Callable[[Scales], list[float]] | None = None
    initial: tuple[dict[str, str], ...] = ({},)  # counter series created at 0 on start-up
    observed: bool = False  # a count kept by telemetry itself (telemetry/drops.py), not read from the record

    def prometheus_names(self) -> list[str]:
        """Names as the OTel Prometheus exporter writes them ('.' -> '_', unit suffix, type suffix)."""
        base = self.name.replace(".", "_") + {"s": "_seconds", "By": "_bytes"}.get(self.unit, "")
        return {"histogram": [f"{base}_bucket", f"{base}_sum", f"{base}_count"], "counter": [f"{base}_total"],
                "gauge": [base]}[self.kind]


def _one(field: str) -> Callable[[StepStats], Points]:
    """The step's `field`; absent when nothing measured it (StepStats.unmeasured), so a histogram never
    counts "not measured" as a rejected non-finite value."""
    return lambda s: [] if field in s.unmeasured else [(getattr(s, field), {})]


def _per_completion(points: Callable[[StepStats], Points]) -> Callable[[StepStats], Points]:
    """A row read from the step's per-completion values: absent when the producer has none (a trainer
    that logs only means, e.g. TRL without wrapped rewards)."""
    return lambda s: [] if s.samples is None else points(s)


def _each(field: str) -> Callable[[StepStats], Series]:
    """Every completion's `field`; absent when the producer could not measure it (Samples.unmeasured)."""
    return _per_completion(lambda s: [] if field in s.samples.unmeasured else
                           [(np.asarray(getattr(s.samples, field), dtype=np.float64), {})])


def _once(field: str) -> Callable[[StepStats], Series]:
    """The step's `field` as a histogram's one value."""
    return lambda s: [] if field in s.unmeasured else [(np.array([getattr(s, field)], dtype=np.float64), {})]


def _linear(top: Callable[[Scales], float], n: int = 10) -> Callable[[Scales], list[float]]:
    return lambda sc: [round(top(sc) * i / n, 6) for i in range(1, n + 1)]


@_per_completion
def _lengths(s: StepStats) -> Series:
    x = s.samples
    if "length" in x.unmeasured:
        return []
    length = np.asarray(x.length, dtype=np.float64)
    if "correct" in x.unmeasured:  # no verifier: the lengths are still real, their split is not known
        return [(length, {"correct": "unknown"})]
    correct = np.asarray(x.correct, dtype=bool)
    return [(length[correct], {"correct": "true"}), (length[~correct], {"correct": "false"})]


@_per_completion
def _components(s: StepStats) -> Series:
    return [(np.asarray(vs, dtype=np.float64), {"function": name}) for name, vs in s.samples.components.items()]


@_per_completion
def _abs_advantages(s: StepStats) -> Series:
    valid = ~np.isnan(s.samples.reward)  # valid completions only, as grpo.reward
    return [(np.abs(np.asarray(s.samples.advantage, dtype=np.float64)[valid]), {})]


def _ratios(s: StepStats) -> Points:
    return [] if "is_ratio_mean" in s.unmeasured else [
        (s.is_ratio_min, {"stat": "min"}), (s.is_ratio_mean, {"stat": "mean"}), (s.is_ratio_max, {"stat": "max"})]


def _zero_std(s: StepStats) -> Points:
    return [(s.frac_zero_std, {"outcome": "any"}), (s.frac_zero_std_correct, {"outcome": "all_correct"}),
            (s.frac_zero_std_wrong, {"outcome": "all_wrong"})]


def _accuracy(s: StepStats) -> Points:
    return [] if s.eval is None else [(s.eval.sample_acc, {"mode": "sampled"}), (s.eval.greedy_acc, {"mode": "greedy"})]


def _severity(s: StepStats, cid: str) -> str:
    """The severity a condition of the step is at: its stage, for a row with more than one (Row.stages)."""
    return "critical" if cid in s.health_critical else BY_ID[cid].severities[0]


def _health(s: StepStats) -> Points:
    # One series per row and severity: an escalated drift row moves from its warning series to its critical one.
    return [(float(r.id in s.health and _severity(s, r.id) == sev), {"condition": r.id, "severity": sev})
            for r in TABLE for sev in r.severities]


def _health_new(s: StepStats) -> Points:
    return [(1.0, {"condition": c, "severity": _severity(s, c)}) for c in s.health_new]


def _health_rows() -> tuple[dict[str, str], ...]:
    return tuple({"condition": r.id, "severity": sev} for r in TABLE for sev in r.severities)


def _skipped(s: StepStats) -> Points:
    return [(1.0, {"reason": s.skipped})] if s.skipped else []


@_per_completion
def _tokens(s: StepStats) -> Points:
    return [] if "length" in s.samples.unmeasured else [(float(s.samples.length.sum()), {})]


def _std_buckets(sc) -> list[float]:
    """Reward-std buckets in units of the run's largest reward."""
    return [round(sc.max_reward * f, 6) for f in (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8)]


def _rewards_invalid(s: StepStats) -> Points:
    return [(float(s.invalid_rewards), {})] if s.invalid_rewards else []


_KL_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]  # k3 per token: healthy runs sit < 0.1
_SECONDS = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]

CATALOGUE: list[Metric] = [
    # Distributions (histograms, explicit buckets per metric)
    Metric(
        "grpo.reward",
        "histogram",
        "1",
        "completion",
        "Combined reward of each valid completion.",
        _each("reward"),
        _linear(lambda sc: sc.max_reward),
    ),
    Metric(
        "grpo.reward.component",
        "histogram",
        "1",
        "completion and reward function",
        "Each reward function's value per completion (attribute `function`).",
        _components,
        _linear(lambda sc: sc.max_reward),
    ),
    Metric(
        "grpo.kl",
        "histogram",
        "1",
        "completion",
        "Token-mean k3 KL to the reference of each completion (>= 0).",
        _each("kl"),
        lambda sc: _KL_BUCKETS,
    ),
    Metric(
        "grpo.entropy",
        "histogram",
        "{nat}",
        "completion",
        "Token-mean entropy (un-tempered, nats) of each completion.",
        _each("entropy"),
        lambda sc: [round(sc.ln_vocab * f, 6) for f in (0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9, 1.0)],
    ),
    Metric(
        "grpo.advantage.abs",
        "histogram",
        "1",
        "completion",
        "abs(advantage) of each valid completion (signed values: the gauges).",
        _abs_advantages,
        lambda sc: [0.01, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
    ),
    Metric(
        "grpo.group.reward_std",
        "histogram",
        "1",
        "group",
        "Unbiased std of each group's valid rewards (0 = no signal).",
        _each("group_reward_std"),
        _std_buckets,
    ),
    Metric(
        "grpo.completion.length",
        "histogram",
        "{token}",
        "completion",
        "Completion tokens incl. EOS (attribute `correct`: true, false, or unknown where the trainer has no verifier).",
        _lengths,
        lambda sc: sorted({float(max(1, round(sc.max_new_tokens * i / 10))) for i in range(1, 11)}),
    ),
    Metric(
        "grpo.mismatch.logp_diff",
        "histogram",
        "1",
        "completion token",
        "|log p_trainer - log p_sampler| of each sampled token: the train/inference mismatch's distribution (0 where "
        "the two agree; bf16 against fp32 sits near 1e-3 to 1e-2).",
        _each("logp_diff"),
        lambda sc: [1e-6, 1e-5, 1e-4, 1e-3, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0],
    ),
    Metric(
        "grpo.step.duration",
        "histogram",
        "s",
        "step",
        "Wall time of a step, rollout to optimizer step.",
        _once("step_time"),
        lambda sc: _SECONDS,
    ),
    # Per-step statistics (gauges: signed values and means)
    Metric(
        "grpo.reward.mean",
        "gauge",
        "1",
        "step",
        "Mean combined reward over the step's valid completions.",
        _one("reward"),
    ),
    Metric("grpo.kl.mean", "gauge", "1", "step", "Token-masked mean k3 KL (absent when beta = 0).", _one("kl")),
    Metric("grpo.loss", "gauge", "1", "step", "The loss actually back-propagated.", _one("loss")),
    Metric("grpo.entropy.mean", "gauge", "{nat}", "step", "Token-masked mean entropy (nats).", _one("entropy")),
    Metric(
        "grpo.entropy.normalized",
        "gauge",
        "1",
        "step",
        "Entropy / ln(V); 1 = uniform over the vocabulary.",
        _one("entropy_norm"),
    ),
    Metric(
        "grpo.entropy.baseline",
        "gauge",
        "{nat}",
        "step",
        "The run's early entropy (median of its first steps), which the entropy rows of the health table compare "
        "with; set by the health monitor.",
        _one("entropy_baseline"),
    ),
    Metric(
        "grpo.advantage.mean",
        "gauge",
        "1",
        "step",
        "Mean advantage; must be ~0 (implementation sentinel).",
        _one("adv_mean"),
    ),
    Metric(
        "grpo.advantage.std",
        "gauge",
        "1",
        "step",
        "Unbiased std of advantages (<= 1 under group scaling).",
        _one("adv_std"),
    ),
    Metric(
        "grpo.frac_zero_std",
        "gauge",
        "1",
        "step",
        "Fraction of groups with no learning signal (attribute `outcome`: any, all_correct, all_wrong).",
        _zero_std,
    ),
    Metric(
        "grpo.train_accuracy",
        "gauge",
        "1",
        "step",
        "Fraction of the step's completions the verifier accepts.",
        _one("train_acc"),
    ),
    Metric(
        "grpo.sample_acc",
        "gauge",
        "1",
        "sampling point",
        "Held-out accuracy (attribute `mode`: sampled at the training temperature, or greedy).",
        _accuracy,
    ),
    Metric(
        "grpo.truncation_rate",
        "gauge",
        "1",
        "step",
        "Fraction of completions that hit max_new_tokens.",
        _one("truncation_rate"),
    ),
    Metric(
        "grpo.repetition_rate",
        "gauge",
        "1",
        "step",
        "Mean over completions of the share of a completion's word 4-grams that repeat an earlier one (seq-rep-4).",
        _one("repetition"),
    ),
    Metric(
        "grpo.clip_fraction",
        "gauge",
        "1",
        "step",
        "Fraction of tokens where the ratio clip was active.",
        _one("clip_frac"),
    ),
    Metric(
        "grpo.mismatch.kl",
        "gauge",
        "1",
        "step",
        "Token mean of k3 between the sampler's and the trainer's log-probs of the sampled tokens: KL(sampler || "
        "trainer), the train/inference mismatch.",
        _one("mismatch_kl"),
    ),
    Metric("grpo.mismatch.logp_diff.mean", "gauge", "1", "step", "Token mean of |log p_trainer - log p_sampler|.",
           _one("logp_diff_mean")),
    Metric("grpo.mismatch.logp_diff.max", "gauge", "1", "step", "Largest |log p_trainer - log p_sampler| of the step.",
           _one("logp_diff_max")),
    Metric(
        "grpo.importance_ratio",
        "gauge",
        "1",
        "step",
        "p_trainer / p_sampler per token, before any correction (attribute `stat`: min, mean, max); 1 where they agree.",
        _ratios,
    ),
    Metric(
        "grpo.importance.masked_fraction",
        "gauge",
        "1",
        "step",
        "Share of tokens the importance-sampling correction (grpo.is_correction) truncated or masked.",
        _one("is_masked_frac"),
    ),
    Metric("grpo.grad_norm", "gauge", "1", "step", "Total gradient norm before clipping.", _one("grad_norm")),
    Metric("grpo.learning_rate", "gauge", "1", "step", "Learning rate of the step.", _one("lr")),
    Metric(
        "grpo.tokens_per_second",
        "gauge",
        "{token}/s",
        "step",
        "Completion tokens generated per second of step time.",
        _one("tokens_per_s"),
    ),
    Metric(
        "grpo.group.size",
        "gauge",
        "{completion}",
        "step",
        "G: completions sampled per prompt (group).",
        _per_completion(lambda s: [(len(s.samples.length) / len(s.samples.group_reward_std), {})]),
    ),
    Metric("grpo.step", "gauge", "1", "step", "The last completed optimizer step.", lambda s: [(float(s.step), {})]),
    # Per training process (attribute `rank`): a straggler shows as one rank busy while the others wait.
    Metric(
        "grpo.rank.step_time",
        "gauge",
        "s",
        "step and rank",
        "Wall time of the step on each rank.",
        lambda s: [(r.step_time, {"rank": str(r.rank)}) for r in s.ranks],
    ),
    Metric(
        "grpo.rank.collective_wait",
        "gauge",
        "s",
        "step and rank",
        "Time each rank spent in the step's explicit collectives (waiting for the slowest rank, then the transfer).",
        lambda s: [(r.wait, {"rank": str(r.rank)}) for r in s.ranks],
    ),
    Metric(
        "grpo.rank.peak_memory",
        "gauge",
        "By",
        "step and rank",
        "Peak memory of each rank: the CUDA allocator's peak, else the process's peak resident set.",
        lambda s: [(r.peak_memory, {"rank": str(r.rank)}) for r in s.ranks],
    ),
    Metric(
        "grpo.step.last_timestamp",
        "gauge",
        "s",
        "step",
        "Unix time the last step completed (stall detection).",
        lambda s: [],
    ),  # recorded by the sink at on_step time, not from the record
    Metric(
        "grpo.health.condition",
        "gauge",
        "1",
        "step and condition",
        "1 while a health-table condition holds, else 0 (attributes `condition`, `severity`).",
        _health,
    ),
    # Counters
    Metric(
        "grpo.health.episodes",
        "counter",
        "{episode}",
        "episode",
        "Health-condition episodes begun (attributes `condition`, `severity`): a one-step condition, e.g. a loss "
        "spike, between two scrapes is still counted.",
        _health_new,
        initial=_health_rows(),
    ),
    Metric(
        "grpo.steps",
        "counter",
        "{step}",
        "step",
        "Optimizer steps completed (skipped updates included).",
        lambda s: [(float(s.steps_in_row), {})] if s.steps_in_row else [],
    ),
    Metric(
        "grpo.completions",
        "counter",
        "{completion}",
        "step",
        "Completions sampled.",
        _per_completion(lambda s: [(float(len(s.samples.length)), {})]),
    ),
    Metric("grpo.tokens", "counter", "{token}", "step", "Completion tokens sampled.", _tokens),
    Metric(
        "grpo.updates.skipped",
        "counter",
        "{step}",
        "step",
        "Updates skipped (attribute `reason`: nonfinite, no_scored_samples).",
        _skipped,
        initial=({"reason": "nonfinite"}, {"reason": "no_scored_samples"}),
    ),
    Metric(
        "grpo.reward.invalid",
        "counter",
        "{call}",
        "step",
        "Reward calls that raised or returned None/NaN/inf or a non-number (sample excluded or given the fallback).",
        _rewards_invalid,
    ),
    Metric(
        "grpo.nonfinite",
        "counter",
        "{value}",
        "step",
        "Non-finite per-step values (attribute `signal`: loss, grad_norm, reward, kl, entropy).",
        lambda s: [],
        initial=tuple({"signal": k} for k in ("loss", "grad_norm", "reward", "kl", "entropy")),
    ),
    Metric(
        "grpo.histogram.rejected",
        "counter",
        "{value}",
        "value",
        "Histogram values not recorded because negative or non-finite (attributes `metric`, `reason`).",
        lambda s: [],
    ),
    Metric(
        "grpo.telemetry.export_failures",
        "counter",
        "{export}",
        "export",
        "Failed metric exports (attribute `exporter`).",
        lambda s: [],
        initial=({"exporter": "otlp"},),
    ),
    Metric(
        "grpo.traces.dropped",
        "counter",
        "{item}",
        "span or score",
        "Trace data not delivered to Langfuse (attributes `signal`: spans, scores; `reason`: queue_full, "
        "unreachable, unauthorized, rejected, shutdown).",
        lambda s: [],
        initial=tuple(
            {"signal": sig, "reason": r}
            for sig in ("spans", "scores")
            for r in ("queue_full", "unreachable", "unauthorized", "rejected", "shutdown")
        ),
        observed=True,
    ),
]


@dataclass(frozen=True)
class DaemonMetric:
    """A series the daemon (`grpo-sentinel serve`) exports itself, next to the active run's."""

    name: str  # as scraped
    kind: str
    description: str


DAEMON = [
    DaemonMetric("grpo_runs", "gauge", "Runs known to the daemon, by status (attribute `status`: queued, running, "
                                       "completed, stopped_early, halted, preempted, stopped, failed, damaged: its summary "
                                       "cannot be read)."),
    DaemonMetric("grpo_runs_finished_total", "counter", "Runs that ended, by how (attribute `status`; failed: see the "
                                                         "run's error)."),
]


def nonfinite_signals(s: StepStats) -> list[str]:
    """Which of the step's core scalars are NaN/inf (kl is legitimately NaN when beta = 0, so it
    counts only when +-inf; a field nothing measured, StepStats.unmeasured, is absent, not overflow)."""
    if s.skipped == "no_scored_samples":  # nothing was measured: NaN means absent, not overflow
        return []
    out = [k for k in ("loss", "grad_norm", "reward", "entropy") if k not in s.unmeasured and not math.isfinite(getattr(s, k))]
    return out + (["kl"] if math.isinf(s.kl) else [])


def markdown() -> str:
    """docs/metrics.md, generated (`grpo-sentinel generate`; telemetry/generated.py)."""
    lines = [
        "# Metric catalogue",
        "",
        "Generated from `telemetry/catalogue.py`; do not edit by hand. Every instrument is exported through",
        "OpenTelemetry: scraped at `/metrics` (Prometheus names below, as a real scrape shows them) and/or",
        "pushed over OTLP (instrument names). Every series carries the run id as the `run_id` label (consecutive",
        "runs of one daemon never share a series) and `otel_scope_*` labels: aggregate with",
        "`sum by (le)` / `sum without (otel_scope_name, otel_scope_version)`. The run's resource",
        "(`service.name`, `service.instance.id`, `grpo.run_id`, `grpo.model`, `grpo.loss_type`, "
        "`grpo.world_size`) is in `target_info`.",
        "",
        "Histograms drop negative and non-finite values in the OTel SDK, so signed signals (advantages, the",
        "loss) are per-step gauges and advantages also a histogram of |A|; a histogram value that is negative or",
        "non-finite is counted in `grpo_histogram_rejected_total` instead. Gauges skip NaN values (e.g. KL when",
        "beta = 0: not measured); non-finite core values are counted in `grpo_nonfinite_total{signal}`.",
        "",
        "A step is recorded on the training thread, in memory (~1 ms); exports run on their own threads.",
        "",
        "| instrument | Prometheus | kind | unit | one value is | buckets | description |",
        "|---|---|---|---|---|---|---|",
    ]
    example = Scales(max_reward=1.0, ln_vocab=math.log(15), max_new_tokens=6)
    for m in CATALOGUE:
        buckets = ", ".join(f"{b:g}" for b in m.buckets(example)) if m.buckets else ""
        lines.append(f"| `{m.name}` | {' '.join(f'`{n}`' for n in m.prometheus_names())} | {m.kind} | `{m.unit}` | "
                     f"{m.per} | {buckets} | {m.description} |")
    lines += ["", "Buckets shown for the demo (max reward 1, V = 15, max_new_tokens = 6); they scale with the run:",
              "rewards over [0, max reward], entropy over [0, ln V], lengths over [0, max_new_tokens].", "",
              "The daemon's own series (`grpo-sentinel serve`, on the same `/metrics` as the active run's; no `run_id`):",
              "", "| Prometheus | kind | description |", "|---|---|---|"]
    lines += [f"| `{d.name}` | {d.kind} | {d.description} |" for d in DAEMON] + [""]
    return "\n".join(lines)

