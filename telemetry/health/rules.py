"""The health table as Prometheus rules: recording rules for the derived signals and one alert per
row, `GRPO<Condition>`, generated from the table and the detectors' thresholds.

Rows the exported series can express are PromQL with the detectors' statistics and thresholds
(telemetry/health/detectors.py), windows in seconds instead of steps: a window mean is the mean of
the per-step gauges scraped in the window, a slope the difference of two consecutive window means.
The rows in TRAINER_SIDE cannot be written in PromQL (the reason is given, and printed in the
runbook); their alerts page on the verdict the trainer's own monitor exports.

`grpo-sentinel generate` writes the defaults to deploy/prometheus/grpo-rules.yml (telemetry/generated.py);
`grpo-sentinel rules --set window=10m --set kl_bound=0.5` writes a variant. Windows, grouping and the
series selector are the monitoring config (telemetry/monitoring.py), which the dashboards read too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

import yaml

from grpo_sentinel.telemetry import monitoring
from grpo_sentinel.telemetry.health.detectors import (
    ESCALATING,
    FORECASTING,
    HELD_Z,
    KL_ACCEL_Z,
    MEDIAN_SE_PER_IQR,
    MIN_STEPS,
)
from grpo_sentinel.telemetry.health.table import OPERATIONAL, TABLE
from grpo_sentinel.telemetry.health.thresholds import KL_RISING_WINDOWS, Thresholds, coerce
from grpo_sentinel.telemetry.monitoring import HEALTH_UID, Monitoring, duration, series

TRAINER_SIDE = {
    "loss_spike": "a spike is one step, and a scrape sees one step in every (scrape interval / step time); the "
                  "trainer sees every step, and its episode counter survives the scrape gap",
    "policy_collapse": "it needs every group without signal on every step of a window (a scrape sees one step in "
                       "many) and compares with the run's own early share of such groups, which only the trainer has",
    "train_inference_mismatch": "its warning compares with the run's own early level, which only the trainer has; its "
                                "jump compares one step with the median of the steps before it, and a scrape sees one "
                                "step in many",
    "late_degradation": "it reads held-out accuracy per evaluation point against the binomial noise of the eval set; "
                        "a time window holds an unknown, varying number of evaluation points",
    "reward_hacking": "as late_degradation: a decline of held-out accuracy beyond its sampling noise, per evaluation point; "
                      "its training-side half is a CUSUM (as correctness_drop)",
    "loss_blowup": "it counts updates whose |loss| exceeds the range of a block of updates 51-149 steps back, a "
                   "distribution-free bound over every update, in a sequential test, and reads the growth's shape from "
                   "block medians; a scrape sees one update in many",
    "entropy_drift": "a CUSUM is a recursion over every step since the early baseline; PromQL keeps no state between "
                     "evaluations",
    "length_drift": "a CUSUM over every step (as entropy_drift), against the completion cap, which the exported series "
                    "do not carry",
    "correctness_drop": "a CUSUM of training correctness against its running peak, over every step (as entropy_drift)",
    "all_wrong_rising": "a CUSUM of the all-wrong share against its early level, over every step (as entropy_drift)",
    "no_progress": "it compares the reward's best window mean since the start with the run's first window, and fits a "
                   "line to every step since the start, in units of the early noise: a state over the whole run that "
                   "PromQL does not keep",
    "zero_gradient": "it needs the gradient norm exactly 0 on every step of a window; a scrape sees one step in many, "
                     "and a non-zero step between scrapes would pass unseen",
    "kl_offset": "it compares the KL with the run's own early KL, which only the trainer has (its first steps)",
    "grad_norm_spike": "a spike is one step (as loss_spike), against the median of the 50 steps before it",
    "clip_imbalance": "the exported series carry one clip fraction (grpo_clip_fraction), not the upper and lower sides",
}
# Where a PromQL row deliberately reads its detector differently.
DIFFERS = {
    "plateau_kl_flat": "PromQL pages whenever KL ~ 0 and the reward is flat; the trainer checks only the start of a "
                       "run (later, the same reading is the same problem, and a page is still right)",
    "kl_runaway": "PromQL reads growth as the KL against its value five windows earlier; the trainer against the run's "
                  "own early KL (its first steps), which a scrape window does not reach",
    "length_capped": "PromQL pages on the truncation rate alone; the trainer also needs the rate to have come from below "
                     "`truncation` early in the run and the reward not rising (a run capped from its first step, or "
                     "learning while capped, is length_pathology's warning)",
    "nonfinite": "PromQL counts skipped updates within the window (`nonfinite_run` or more: critical); the trainer "
                 "counts them in a row",
    "length_drift": "its escalated stage reads the trainer's warning held and the truncation rate rising; the trainer also "
                    "needs the rise beyond two standard errors and does not escalate while the reward rises (as "
                    "length_capped). Its forecast stage reads the trainer's warning and predict_linear of the truncation "
                    "rate; the trainer also needs the trend beyond 3 standard errors and the level reached at one "
                    "standard error under its slope, and no reward rising with half the completions cut",
    "correctness_drop": "its escalated stage reads the trainer's warning held and the training accuracy falling; the "
                        "trainer also needs the fall beyond two standard errors. Its forecast stage reads the trainer's "
                        "warning and predict_linear of the training accuracy below 90 % of its recent peak; the trainer "
                        "also needs the trend beyond 3 standard errors, the level reached at one standard error under its "
                        "slope, and an auxiliary reward holding (exported series carry no auxiliary reward)",
    "entropy_drift": "its forecast stage reads the trainer's warning and predict_linear of the reward losing `reward_drop` "
                     "within the horizon; the trainer also needs the trend beyond 3 standard errors, the level reached at "
                     "one standard error under its slope, and the reward's 2w mean below the one 2w earlier beyond its "
                     "noise",
}


# The drift rows whose warning escalates (detectors._escalate): row id -> the PromQL for "its signal
# is worse than a window earlier". The critical rule is the warning's expression and that, held for
# `escalate_windows` windows (`for:`, as the detector's run of consecutive steps). Trainer-side rows
# read the trainer's verdict for the warning part. They read recording rules only, so no params.
def _worse() -> dict[str, str]:
    worse = {
        "kl_acceleration": f"grpo:kl_mean:avg_w - grpo:kl_mean:avg_w_prev > {_num(2 * math.sqrt(2))} * grpo:kl_mean:se_w",
        "length_drift": "grpo:truncation_rate:avg_w > grpo:truncation_rate:avg_w_prev",
        "correctness_drop": "grpo:train_accuracy:avg_w < grpo:train_accuracy:avg_w_prev",
    }
    assert set(worse) == set(ESCALATING), "every escalating detector row has its rule"
    return worse


# The drift rows' forecast stage (detectors._forecast): row id -> the PromQL for "its signal, at its
# present trend, reaches the row's failure level within the horizon H = `forecast_windows` windows".
# The critical rule is the warning's expression and that (no hold beyond the warning's own `for:`).
def _foresee(p: "RuleParams") -> dict[str, str]:
    t, by, w2 = p.thresholds, _by(p), duration(2 * p.window)
    h = _num(t.forecast_windows * p.window)  # seconds: predict_linear's horizon

    def line(metric: str) -> str:  # the least-squares line over the last 2w, continued H ahead
        return f"avg {by} (predict_linear({series(p, metric)}[{w2}], {h}))"

    foresee = {
        # At the growth ratio a window both of the last two windows show (r), KL is m0 r^(H/w) at H.
        # ... for as many windows as the KL has risen in a row (up to H).
        "kl_acceleration": f"grpo:kl_mean:avg_w * clamp_min(grpo:kl_mean:ratio_w, 1) "
                           f"^ clamp_max(grpo:kl_mean:rising_windows, {_num(t.forecast_windows)}) > {_num(t.kl_bound)}",
        "length_drift": f"{line('grpo_truncation_rate')} >= {_num(t.truncation_capped)}",
        "correctness_drop": f"{line('grpo_train_accuracy')}\n< {_num(1 - t.correctness_drop)} * "
                            f"max_over_time(grpo:train_accuracy:avg_2w[{duration(t.correctness_lookback * 2 * p.window)}:])",
        "entropy_drift": f"{line('grpo_reward_mean')}\n< grpo:reward_mean:avg_2w - {_num(t.reward_drop * p.max_reward)}",
    }
    assert set(foresee) == set(FORECASTING), "every forecasting detector row has its rule"
    return foresee


@dataclass(frozen=True)
class RuleParams(Monitoring):
    """The monitoring config (window, pending, stall, group_by, selector) and the alerts' own settings."""
    max_reward: float = 1.0  # the reward's maximum (rewards are judged as a fraction of it)
    runbook: str = "docs/runbook.md"  # runbook_url base; a deployment points it at its own copy
    grafana: str = ""  # Grafana base URL: alerts then link the run's dashboard (`dashboard_url`)
    langfuse: str = ""  # Langfuse project URL (https://host/project/<id>): alerts link the run's generations
    straggler: float = 1.5  # a rank whose busy time is this multiple of the fastest rank's is a straggler
    thresholds: Thresholds = field(default_factory=Thresholds)


# The detector thresholds the PromQL rows read (the others belong to trainer-side rows).
RULE_THRESHOLDS = ("adv_mean_tol", "nonfinite_run", "saturated", "zero_signal", "kl_flat", "reward_drop", "loose_gap",
                   "loose_reward", "small_group", "small_group_zero", "kl_bound", "kl_dominant_min", "kl_dominant_zero",
                   "entropy_collapse", "entropy_blowup_lnv", "entropy_blowup_baseline", "entropy_blowup_rise_lnv",
                   "exploration_rise", "exploration_signal", "truncation", "wrong_longer", "kl_accel", "kl_accel_min",
                   "truncation_capped", "kl_growth", "repetition", "escalate_windows", "forecast_windows",
                   "correctness_drop", "correctness_lookback")


MONITORING = tuple(f.name for f in fields(Monitoring))  # parsed by monitoring.parse


def with_settings(p: RuleParams, settings: list[str]) -> RuleParams:
    """Apply NAME=VALUE settings (a RuleParams field or a threshold in RULE_THRESHOLDS); any problem
    raises ValueError saying what to write instead. Every value is checked against its domain (a
    negative bound, a zero maximum reward, a fraction above 1 make rules that never or always fire)."""
    own = [f.name for f in fields(RuleParams) if f.name != "thresholds"]
    p_kw, th_kw = {}, {}
    for s in settings:
        name, eq, value = s.partition("=")
        if not eq:
            raise ValueError(f"{s!r}: write NAME=VALUE, e.g. kl_bound=0.5")
        if name not in own and name not in RULE_THRESHOLDS:
            raise ValueError(f"unknown rule setting {name!r}; known: {', '.join(own + list(RULE_THRESHOLDS))}")
        if name in MONITORING:
            p_kw[name] = monitoring.parse(name, value)
            continue
        if name not in own:
            th_kw[name] = coerce(name, value)
            continue
        kind = type(getattr(p, name))
        want = {str: "text", int: "whole number"}.get(kind, "number")
        try:
            if kind is str:
                p_kw[name] = value
            else:
                x = float(value)
                if not math.isfinite(x) or (kind is int and not x.is_integer()):
                    raise ValueError
                p_kw[name] = kind(x)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not a {want}") from None
        error = ("max_reward must be > 0 (the reward's maximum; rewards are judged as a fraction of it)"
                 if name == "max_reward" and p_kw[name] <= 0 else
                 "straggler must be > 1 (a multiple of the fastest rank's busy time)"
                 if name == "straggler" and p_kw[name] <= 1 else None)
        if error:
            raise ValueError(f"{name}={value!r}: {error}")
    return replace(p, **p_kw, thresholds=replace(p.thresholds, **th_kw))


def _num(x: float) -> str:
    return f"{x:g}"


def _by(p: RuleParams, *extra: str) -> str:
    """The aggregation clause every rule uses: `by (job, instance, run_id)` by default (RuleParams.group_by),
    so two consecutive runs on one trainer never share a window."""
    return f"by ({', '.join((*p.group_by, *extra))})"


def recording_rules(p: RuleParams) -> list[dict]:
    w, w2 = duration(p.window), duration(2 * p.window)
    by = _by(p)

    def avg(metric: str, rng: str, offset: str = "", sel: str = "") -> str:
        off = f" offset {offset}" if offset else ""
        return f"avg {by} (avg_over_time({series(p, metric, sel)}[{rng}]{off}))"

    def length_mean(offset: str = "") -> str:
        off = f" offset {offset}" if offset else ""
        return (f"sum {_by(p, 'correct')} (rate({series(p, 'grpo_completion_length_sum')}[{w}]{off}))\n"
                f"/ sum {_by(p, 'correct')} (rate({series(p, 'grpo_completion_length_count')}[{w}]{off}))")

    loss, step, kl = series(p, "grpo_loss"), series(p, "grpo_step"), series(p, "grpo_kl_mean")
    rules = {
        # Window means of per-step gauges (w = the window, 2w = two windows), and the same window
        # one and two windows earlier: a slope is the difference of consecutive window means.
        "grpo:reward_mean:avg_w": avg("grpo_reward_mean", w),
        "grpo:reward_mean:avg_w_prev": avg("grpo_reward_mean", w, w),
        "grpo:reward_mean:avg_2w": avg("grpo_reward_mean", w2),
        # Reward change over the last two windows (detectors._reward_flat): ~0 on a plateau.
        "grpo:reward_mean:gain_2w": "2 * (grpo:reward_mean:avg_w - grpo:reward_mean:avg_2w)",
        "grpo:kl_mean:avg_w": avg("grpo_kl_mean", w),
        "grpo:kl_mean:avg_w_prev": avg("grpo_kl_mean", w, w),
        "grpo:kl_mean:avg_w_prev2": avg("grpo_kl_mean", w, w2),
        # The KL's growth ratio a window that the last two windows both show (the smaller of m0 / m1 and
        # m1 / m2: `a <= b or b` is min(a, b)), which kl_acceleration's forecast raises to its horizon.
        "grpo:kl_mean:ratio_w": ("grpo:kl_mean:avg_w / grpo:kl_mean:avg_w_prev\n"
                                 "<= grpo:kl_mean:avg_w_prev / grpo:kl_mean:avg_w_prev2\n"
                                 "or grpo:kl_mean:avg_w_prev / grpo:kl_mean:avg_w_prev2"),
        # The KL k windows back, k = 3 .. KL_RISING_WINDOWS: kl_acceleration's fourth window and its forecast's
        # count of rising windows; five back, kl_runaway's growth (not an offset the run started with).
        **{_kl_prev(k): avg("grpo_kl_mean", w, duration(k * p.window)) for k in range(3, KL_RISING_WINDOWS + 1)},
        # How many windows in a row, back from now, each KL window mean rose over the one before (of the last
        # KL_RISING_WINDOWS): how far kl_acceleration's forecast projects the growth (at most H). An earlier
        # window the run does not have yet counts as not risen (`or ... * 0`), as in detectors.kl_rows.
        "grpo:kl_mean:rising_windows": _rising_windows(KL_RISING_WINDOWS),
        "grpo:frac_zero_std:avg_w": avg("grpo_frac_zero_std", w, sel='outcome="any"'),
        "grpo:train_accuracy:avg_w": avg("grpo_train_accuracy", w),
        "grpo:train_accuracy:avg_w_prev": avg("grpo_train_accuracy", w, w),
        "grpo:train_accuracy:avg_2w": avg("grpo_train_accuracy", w2),
        # Reward above what the strict verifier accepts on the same completions (both as fractions).
        "grpo:reward_over_accuracy:avg_2w": f"grpo:reward_mean:avg_2w / {_num(p.max_reward)} - grpo:train_accuracy:avg_2w",
        "grpo:loss:avg_2w": avg("grpo_loss", w2),
        "grpo:loss:avg_2w_prev2": avg("grpo_loss", w2, w2),
        "grpo:loss:median_2w": f"avg {by} (quantile_over_time(0.5, {loss}[{w2}]))",
        "grpo:loss:median_2w_prev2": f"avg {by} (quantile_over_time(0.5, {loss}[{w2}] offset {w2}))",
        # Its interquartile range: the loss's noise, robust to the spikes a mean or sd would take in.
        "grpo:loss:iqr_2w_prev2": f"avg {by} (quantile_over_time(0.75, {loss}[{w2}] offset {w2})\n"
                                  f"- quantile_over_time(0.25, {loss}[{w2}] offset {w2}))",
        # Steps the window holds: changes of the step counter, not scrapes (a scrape faster than the
        # steps sees each step several times, and repeated samples are not independent ones).
        "grpo:steps:seen_w": f"max {by} (changes({step}[{w}])) + 1",
        "grpo:steps:seen_2w": f"max {by} (changes({step}[{w2}])) + 1",
        # Standard error of the 2w loss mean: the noise a fall of the loss must stand out of.
        "grpo:loss:se_2w": f"avg {by} (stddev_over_time({loss}[{w2}]))\n/ sqrt(grpo:steps:seen_2w)",
        # Standard error of the w KL mean from its step-to-step noise: the sd of consecutive differences
        # (idelta at every evaluation of the window; a repeated scrape of one step, a zero difference,
        # is left out) / sqrt 2, over sqrt(steps): a trend only shifts the differences' mean
        # (detectors._diff_se), for kl_acceleration.
        "grpo:kl_mean:se_w": (
            f"avg {by} (stddev_over_time((idelta({kl}[{w2}]) != 0)[{w}:]))\n"
            f"/ {_num(math.sqrt(2))} / sqrt(grpo:steps:seen_w)"
        ),
        "grpo:entropy_mean:avg_w": avg("grpo_entropy_mean", w),
        "grpo:entropy_mean:avg_w_prev": avg("grpo_entropy_mean", w, w),
        "grpo:entropy_normalized:avg_w": avg("grpo_entropy_normalized", w),
        # The run's early entropy, as the trainer's monitor computed it, and ln V (= entropy / normalized).
        "grpo:entropy:baseline": f"max {by} ({series(p, 'grpo_entropy_baseline')})",
        "grpo:ln_vocab": f"max {by} ({series(p, 'grpo_entropy_mean')} / {series(p, 'grpo_entropy_normalized')})",
        "grpo:truncation_rate:avg_w": avg("grpo_truncation_rate", w),
        "grpo:truncation_rate:avg_w_prev": avg("grpo_truncation_rate", w, w),
        "grpo:repetition_rate:avg_w": avg("grpo_repetition_rate", w),
        # Completion length per completion (from the histogram: every completion counts), by correctness.
        "grpo:completion_length:mean_w": length_mean(),
        "grpo:completion_length:mean_w_prev": length_mean(w),
        # Each rank's busy time per step (its step time minus its wait in collectives), for stragglers.
        "grpo:rank_busy_seconds:avg_w": (
            f"avg {_by(p, 'rank')} (avg_over_time({series(p, 'grpo_rank_step_time_seconds')}[{w}]))\n"
            f"- avg {_by(p, 'rank')} (avg_over_time({series(p, 'grpo_rank_collective_wait_seconds')}[{w}]))"
        ),
    }
    return [{"record": k, "expr": v} for k, v in rules.items()]


def _kl_prev(k: int) -> str:
    """The recorded KL window mean k windows back."""
    return "grpo:kl_mean:avg_w" + ("" if k == 0 else "_prev" if k == 1 else f"_prev{k}")


def _rising_windows(h: int) -> str:
    """b0 * (1 + b1 * (1 + ... b_{h-1})), b_i = 1 where window mean i rose over window mean i + 1: the
    length of the run of rises back from now (detectors.kl_rows' `held`)."""
    def rose(i: int) -> str:
        return f"({_kl_prev(i)} > bool {_kl_prev(i + 1)} or grpo:kl_mean:avg_w * 0)"
    expr = rose(h - 1)
    for i in range(h - 2, -1, -1):
        expr = f"{rose(i)} * (1 + {expr})"
    return expr


def _aged(p: RuleParams, windows: int) -> str:
    """Present once the run has `windows` windows of history: detectors only judge full windows."""
    return f"max {_by(p)} ({series(p, 'grpo_step')} offset {duration(windows * p.window)})"


def _verdict(cid: str, p: RuleParams, severity: str | None = None) -> str:
    """The trainer's verdict (at `severity`, if given): active now, or an episode begun within the last window
    (a one-step condition may fall between two scrapes; the counter does not)."""
    condition = f'condition="{cid}"' + (f', severity="{severity}"' if severity else "")
    return (f"max {_by(p)} ({series(p, 'grpo_health_condition', condition)}) == 1\n"
            f"or sum {_by(p)} (increase({series(p, 'grpo_health_episodes_total', condition)}[{duration(p.window)}])) > 0")


def _promql(p: RuleParams) -> dict[str, tuple[str, str, str]]:
    """row id -> (expr, summary, description). Each mirrors its detector in detectors.py."""
    t, w = p.thresholds, duration(p.window)
    flat = f"abs(grpo:reward_mean:gain_2w) < {_num(t.reward_drop * p.max_reward)}"
    skipped = series(p, "grpo_updates_skipped_total", 'reason="nonfinite"')
    return {
        "adv_mean_drift": (
            f"max {_by(p)} (abs({series(p, 'grpo_advantage_mean')})) > {_num(t.adv_mean_tol)}",
            "advantage mean {{ $value }} != 0: an implementation bug",
            "Per-sequence advantages must average to 0 within each group (tolerance "
            f"{_num(t.adv_mean_tol)}); the last step's mean is {{{{ $value }}}}.",
        ),
        "nonfinite": (
            f"round(sum {_by(p)} (increase({skipped}[{w}]))) > 0",
            "{{ $value }} update(s) skipped for NaN/Inf in the last " + w,
            f"Updates skipped because the loss or gradients were not finite: {{{{ $value }}}} in {w}; "
            f"{t.nonfinite_run} or more is critical.",
        ),
        "reward_saturated": (
            f"grpo:train_accuracy:avg_w >= {_num(t.saturated)} and {_aged(p, 1)}",
            "correctness {{ $value | humanizePercentage }} over " + w + ": nothing left to learn",
            f"The verifier accepts {{{{ $value | humanizePercentage }}}} of completions over {w} "
            f"(threshold {_num(t.saturated)}); groups are all-correct and carry no signal.",
        ),
        "signal_vanished": (
            f"grpo:frac_zero_std:avg_w >= {_num(t.zero_signal)} and {_aged(p, 1)}",
            "{{ $value | humanizePercentage }} of groups carry no learning signal",
            f"frac_zero_std averaged over {w} is {{{{ $value }}}} (threshold {_num(t.zero_signal)}); the all_correct / "
            "all_wrong split on the dashboard says whether the prompts are too easy or too hard.",
        ),
        "plateau_kl_flat": (
            f"grpo:kl_mean:avg_w < {_num(t.kl_flat)} and {flat} and {_aged(p, 2)}",
            "KL {{ $value }} (~0) and reward flat: the policy is not moving",
            f"Mean KL over {w} is {{{{ $value }}}} (below {_num(t.kl_flat)}) and the reward changed by less than "
            f"{_num(t.reward_drop * p.max_reward)} over {duration(2 * p.window)}.",
        ),
        "plateau_grader_loose": (
            f"(\n  grpo:reward_over_accuracy:avg_2w >= {_num(t.loose_gap)}\n"
            f"  and grpo:reward_mean:avg_2w / {_num(p.max_reward)} >= {_num(t.loose_reward)}\n"
            f"  and {flat}\n  and {_aged(p, 2)}\n)\n"
            f"unless grpo:kl_mean:avg_w < {_num(t.kl_flat)}",  # KL ~ 0 is plateau_kl_flat; an absent KL (beta = 0) does not block
            "reward {{ $value | humanizePercentage }} above what the verifier accepts, and flat",
            f"Over {duration(2 * p.window)} the reward (as a fraction of {_num(p.max_reward)}) exceeds the strict "
            "verifier's acceptance of the same completions by {{ $value | humanizePercentage }}, while the reward is flat.",
        ),
        "plateau_small_group": (
            f"grpo:frac_zero_std:avg_w >= {_num(t.small_group_zero)}\n"
            f"and max {_by(p)} ({series(p, 'grpo_group_size')}) <= {t.small_group}\nand {flat}\nand {_aged(p, 2)}",
            "G <= " + str(t.small_group) + ": reward flat, {{ $value | humanizePercentage }} of groups without signal",
            f"Completions per group <= {t.small_group}, {{{{ $value | humanizePercentage }}}} of groups without signal "
            "and the reward flat: group statistics are too noisy to learn from.",
        ),
        "kl_runaway": (
            f"grpo:kl_mean:avg_w > {_num(t.kl_bound)}\nand grpo:kl_mean:avg_w > {_num(t.kl_growth)} * grpo:kl_mean:avg_w_prev5\n"
            f"and grpo:reward_mean:avg_w < grpo:reward_mean:avg_w_prev\nand {_aged(p, 2)}",
            "KL {{ $value }} per token while reward falls",
            f"Mean k3 KL over {w} is {{{{ $value }}}} (bound {_num(t.kl_bound)}), more than {_num(t.kl_growth)}x its "
            f"value {duration(5 * p.window)} earlier, and the reward's {w} mean is below the previous window's.",
        ),
        "kl_dominant": (
            f"grpo:kl_mean:avg_w > {_num(t.kl_dominant_min)}\nand grpo:kl_mean:avg_w > 2 * grpo:kl_mean:avg_w_prev2\n"
            f"and grpo:kl_mean:avg_w > grpo:kl_mean:avg_w_prev\nand grpo:frac_zero_std:avg_w >= {_num(t.kl_dominant_zero)}\n"
            f"and {_aged(p, 2)}",
            "KL rising to {{ $value }} with no reward signal left",
            f"Mean KL over {w} is {{{{ $value }}}}, more than twice its value {duration(2 * p.window)} ago, while at least "
            f"{_num(t.kl_dominant_zero)} of groups carry no reward signal: the KL term is the only gradient.",
        ),
        "kl_acceleration": (
            f"grpo:kl_mean:avg_w >= {_num(t.kl_accel_min)}\n"
            f"and grpo:kl_mean:avg_w_prev - grpo:kl_mean:avg_w_prev2 > {_num(KL_ACCEL_Z * math.sqrt(2))} * grpo:kl_mean:se_w\n"
            f"and (grpo:kl_mean:avg_w - grpo:kl_mean:avg_w_prev) - {_num(t.kl_accel)} * "
            "(grpo:kl_mean:avg_w_prev - grpo:kl_mean:avg_w_prev2)\n"
            f"  > {_num(KL_ACCEL_Z * math.sqrt(1 + (1 + t.kl_accel) ** 2 + t.kl_accel**2))} * grpo:kl_mean:se_w\n"
            f"and grpo:kl_mean:avg_w_prev2 - grpo:kl_mean:avg_w_prev3 > {_num(HELD_Z * math.sqrt(2))} * grpo:kl_mean:se_w\n"
            "and (grpo:kl_mean:avg_w_prev - grpo:kl_mean:avg_w_prev2) - (grpo:kl_mean:avg_w_prev2 - grpo:kl_mean:avg_w_prev3)\n"
            f"  > {_num(HELD_Z * math.sqrt(6))} * grpo:kl_mean:se_w\n"
            f"and grpo:steps:seen_w >= {MIN_STEPS}\nand {_aged(p, 4)}",
            "KL {{ $value }} and its growth accelerating",
            f"Mean KL over {w} is {{{{ $value }}}} and grew more than {_num(t.kl_accel)}x as much over the last {w} as "
            f"over the {w} before, beyond its noise, after rising beyond its noise three windows in a row and speeding up "
            "the window before too: super-linear growth, the lead of kl_runaway.",
        ),
        "kl_only_learning": (
            "grpo:loss:avg_2w < 0.5 * grpo:loss:avg_2w_prev2\n"
            "and grpo:loss:avg_2w_prev2 > 5 * grpo:loss:se_2w\n"
            f"and grpo:loss:avg_2w_prev2 - grpo:loss:avg_2w > {_num(5 * math.sqrt(2))} * grpo:loss:se_2w\n"
            "and grpo:loss:median_2w < 0.5 * grpo:loss:median_2w_prev2\n"
            "and grpo:loss:median_2w_prev2 - grpo:loss:median_2w\n"
            f"  > {_num(5 * math.sqrt(2) * MEDIAN_SE_PER_IQR)} * grpo:loss:iqr_2w_prev2 / sqrt(grpo:steps:seen_2w)\n"
            f"and grpo:steps:seen_2w >= {2 * MIN_STEPS}\nand {flat}\nand {_aged(p, 4)}",
            "loss fell to {{ $value }} while the reward is flat",
            f"The loss's {duration(2 * p.window)} mean ({{{{ $value }}}}) is below half its value {duration(2 * p.window)} "
            "earlier, well beyond its noise, while the reward is flat: the optimiser is only shrinking KL.",
        ),
        "entropy_collapse": (
            f"grpo:entropy_mean:avg_w < {_num(t.entropy_collapse)} * grpo:entropy:baseline\n"
            "and grpo:entropy_mean:avg_w <= grpo:entropy_mean:avg_w_prev\n"
            f"and abs(grpo:reward_mean:avg_w - grpo:reward_mean:avg_w_prev) < {_num(t.reward_drop * p.max_reward)}\n"
            f"and {_aged(p, 2)}",
            "entropy {{ $value }} nats, far below its early level, and reward flat",
            f"Mean entropy over {w} is {{{{ $value }}}} nats, below {_num(t.entropy_collapse)}x the run's early "
            "baseline and not rising, while the reward is flat: exploration is lost.",
        ),
        "entropy_blowup": (
            f"grpo:entropy_normalized:avg_w >= {_num(t.entropy_blowup_lnv)} and {_aged(p, 2)}\n"
            f"or grpo:entropy_normalized:avg_w and (\n"
            f"  grpo:entropy_mean:avg_w > {_num(t.entropy_blowup_baseline)} * grpo:entropy:baseline\n"
            f"  and grpo:entropy_mean:avg_w - grpo:entropy:baseline > {_num(t.entropy_blowup_rise_lnv)} * grpo:ln_vocab\n"
            f"  and grpo:reward_mean:avg_w < grpo:reward_mean:avg_w_prev\n  and {_aged(p, 2)}\n)",
            "entropy {{ $value | humanizePercentage }} of ln V: generation turning random",
            f"Mean entropy over {w} is {{{{ $value | humanizePercentage }}}} of ln V: at least "
            f"{_num(t.entropy_blowup_lnv)}, or more than {_num(t.entropy_blowup_baseline)}x the run's early baseline "
            "while the reward falls.",
        ),
        "exploration": (
            f"grpo:entropy_mean:avg_w > {_num(t.exploration_rise)} * grpo:entropy:baseline\n"
            "and grpo:entropy_mean:avg_w > grpo:entropy_mean:avg_w_prev\n"
            "and grpo:reward_mean:avg_w > grpo:reward_mean:avg_w_prev\n"
            f"and grpo:frac_zero_std:avg_w < {_num(t.exploration_signal)}\nand {_aged(p, 2)}",
            "entropy rising to {{ $value }} nats while reward rises: healthy exploration",
            f"Mean entropy over {w} is {{{{ $value }}}} nats, above {_num(t.exploration_rise)}x its early baseline "
            "and rising, while the reward rises and groups still carry signal. Nothing to do.",
        ),
        "length_capped": (
            f"grpo:truncation_rate:avg_w >= {_num(t.truncation_capped)} and {_aged(p, 1)}",
            "{{ $value | humanizePercentage }} of completions cut at max_new_tokens",
            f"The truncation rate over {w} is {{{{ $value | humanizePercentage }}}} (threshold {_num(t.truncation_capped)}): "
            "almost no completion ends, cut answers are not graded, and the gradient heads to 0.",
        ),
        "repetition": (
            f"grpo:repetition_rate:avg_w >= {_num(t.repetition)} and {_aged(p, 1)}",
            "{{ $value | humanizePercentage }} of the completions' 4-grams repeat: degenerate loops",
            f"The completions' mean seq-rep-4 over {w} is {{{{ $value | humanizePercentage }}}} (threshold "
            f"{_num(t.repetition)}): a share of each completion's word 4-grams that repeat an earlier one far above prose.",
        ),
        "length_pathology": (
            f"grpo:truncation_rate:avg_w >= {_num(t.truncation)} and {_aged(p, 1)}\nor max without (correct) (\n"
            f'  grpo:completion_length:mean_w{{correct="false"}}\n'
            f'  > ignoring (correct) {_num(t.wrong_longer)} * grpo:completion_length:mean_w{{correct="true"}}\n'
            '  and grpo:completion_length:mean_w{correct="false"} > grpo:completion_length:mean_w_prev{correct="false"}\n'
            f"  and ignoring (correct) {_aged(p, 1)}\n)",
            "completions pinned at max_new_tokens, or wrong answers growing longer",
            f"Truncation rate over {w} at or above {_num(t.truncation)}, or wrong completions more than "
            f"{_num(t.wrong_longer)}x as long as right ones and growing (value {{{{ $value }}}}: the truncation rate, "
            "or the wrong completions' mean length in tokens).",
        ),
    }


def _camel(cid: str) -> str:
    return "".join("KL" if part == "kl" else part.capitalize() for part in cid.split("_"))


def alert_name(cid: str) -> str:
    """'kl_runaway' -> 'GRPOKLRunaway'."""
    return "GRPO" + _camel(cid)


def _dashboard(p: RuleParams) -> dict[str, str]:
    """Links from the page: the alerting run's dashboard (grafana/dashboards/grpo-health.json) and its
    generations in Langfuse (the trace exporter makes the run id the session id). Job and run id come
    from the alert's own labels (every series carries run_id); without run_id in group_by the alert has
    no such label, and the run is looked up in `target_info` when the alert fires."""
    if "run_id" in p.group_by:
        run = "{{ $labels.run_id | urlquery }}"
    else:
        run = ('{{ with printf "max by (grpo_run_id) (target_info{job=%q, instance=%q})" $labels.job $labels.instance '
               '| query }}{{ . | first | label "grpo_run_id" | urlquery }}{{ end }}')
    out = {}
    if p.grafana:
        out["dashboard_url"] = f"{p.grafana.rstrip('/')}/d/{HEALTH_UID}?var-job={{{{ $labels.job | urlquery }}}}&var-run={run}"
    if p.langfuse:
        out["generations_url"] = f"{p.langfuse.rstrip('/')}/sessions/{run}"
    return out


def health_rules(p: RuleParams) -> list[dict]:
    promql, worse, foresee, out = _promql(p), _worse(), _foresee(p), []
    for row in TABLE:
        trainer_staged = (row.id in TRAINER_SIDE and row.severity != "critical" and "critical" in row.severities
                          and row.id not in worse and row.id not in foresee)  # a critical stage the trainer alone judges
        if row.id in promql:
            expr, summary, description = promql[row.id]
        else:
            expr = _verdict(row.id, p, row.severity if trainer_staged else None)
            summary = f"{row.id} (the trainer's health monitor)"
            description = (f"The trainer's monitor reports {row.id} (signals: {row.signals}). PromQL cannot express it: "
                           f"{TRAINER_SIDE[row.id]}. The evidence is in the trainer's log and `grpo-sentinel diagnose`.")
        rule = {"alert": alert_name(row.id), "expr": expr}
        if row.id not in ("adv_mean_drift", "nonfinite") and row.id not in TRAINER_SIDE:
            rule["for"] = duration(p.pending)  # events page at once; window means must hold
        severity = row.severity
        if row.id == "nonfinite":  # a single skipped step is a warning; a run of them is critical
            at = _num(p.thresholds.nonfinite_run - 0.5)
            severity = f"{{{{ if ge $value {at} }}}}critical{{{{ else }}}}warning{{{{ end }}}}"
        rule["labels"] = {"severity": severity, "condition": row.id}
        rule["annotations"] = {
            "summary": "{{ $labels.instance }}: " + summary,
            "description": description,
            "cause": row.cause,
            "action": row.action,
            "runbook_url": f"{p.runbook}#{row.id}",
            **_dashboard(p),
        }
        out.append(rule)
        if row.id in worse:  # the critical stage of a drift row's warning (detectors._escalate)
            held = duration(p.thresholds.escalate_windows * p.window)
            out.append({**rule, "expr": f"(\n{expr}\n)\nand {worse[row.id]}", "for": held,
                        "labels": {"severity": "critical", "condition": row.id, "stage": "escalated"},
                        "annotations": {**rule["annotations"], "summary": rule["annotations"]["summary"] +
                                        f" (held {held} while getting worse: critical)"}})
        if trainer_staged:
            out.append({**rule, "expr": _verdict(row.id, p, "critical"),
                        "labels": {"severity": "critical", "condition": row.id, "stage": "critical"},
                        "annotations": {**rule["annotations"], "summary": rule["annotations"]["summary"] +
                                        " (at its critical stage)"}})
        if row.id in foresee:  # the forecast stage (detectors._forecast): critical with the warning
            horizon = duration(p.thresholds.forecast_windows * p.window)
            out.append({**rule, "expr": f"(\n{expr}\n)\nand {foresee[row.id]}",
                        "labels": {"severity": "critical", "condition": row.id, "stage": "forecast"},
                        "annotations": {**rule["annotations"], "summary": rule["annotations"]["summary"] +
                                        f" (at its trend, failing within {horizon}: critical)"}})
    return out


def operational_rules(p: RuleParams) -> list[dict]:
    words = {anchor: (severity, cause, action) for anchor, severity, _, cause, action in OPERATIONAL}
    failed = series(p, "grpo_runs_finished_total", 'status="failed"')
    specs = [
        ("GRPOTrainingStalled", "training-stalled",
         f"time() - max {_by(p)} ({series(p, 'grpo_step_last_timestamp_seconds')}) > {p.stall}", "1m",
         "no training step for {{ $value | humanizeDuration }}",
         f"The last step completed {{{{ $value | humanizeDuration }}}} ago (threshold {duration(p.stall)})."),
        ("GRPOMetricsExportFailing", "metrics-export-failing",
         f"sum {_by(p)} (increase({series(p, 'grpo_telemetry_export_failures_total')}[{duration(2 * p.window)}])) > 0",
         duration(2 * p.window), "OTLP metric exports failing ({{ $value }} recently)",
         "The trainer keeps training; metrics pushed over OTLP are being lost."),
        ("GRPOTracesDropped", "traces-dropped",
         f"sum {_by(p, 'reason')} (increase({series(p, 'grpo_traces_dropped_total')}[{duration(2 * p.window)}])) > 0",
         duration(p.pending), "{{ $value }} Langfuse spans and scores dropped ({{ $labels.reason }})",
         f"Trace data not delivered to Langfuse in the last {duration(2 * p.window)}, reason `{{{{ $labels.reason }}}}` "
         "(unauthorized: check the keys; unreachable: the server or the network; queue_full: the trainer produces "
         "traces faster than they can be sent). Training is unaffected."),
        ("GRPORunFailed", "run-failed",
         f"sum by ({', '.join(x for x in p.group_by if x != 'run_id')}) "
         f"(increase({failed}[{duration(2 * p.window)}])) > 0",
         "0s", "a run failed ({{ $value }} recently)",
         "A run the daemon was training ended `failed`; the daemon has gone on with the next one. "
         "GET /v1/runs says which and why (its `error`), and its train.log has the rest."),
        ("GRPORankStraggler", "rank-straggler",
         f"max {_by(p)} (grpo:rank_busy_seconds:avg_w) > {_num(p.straggler)} * min {_by(p)} (grpo:rank_busy_seconds:avg_w)"
         f"\nand count {_by(p)} (grpo:rank_busy_seconds:avg_w) > 1",
         duration(p.pending), "one rank is {{ $value | humanizeDuration }} busy a step, far above the fastest",
         f"Over {duration(p.window)} the slowest rank's busy time per step (step time minus the time it waited in "
         f"collectives) is above {_num(p.straggler)}x the fastest rank's: every rank waits for it. The dashboard's "
         "rank panel says which rank."),
    ]
    out = []
    for alert, anchor, expr, pending, summary, description in specs:
        severity, cause, action = words[anchor]
        out.append({"alert": alert, "expr": expr, "for": pending, "labels": {"severity": severity, "condition": anchor},
                    "annotations": {"summary": "{{ $labels.instance }}: " + summary, "description": description,
                                    "cause": cause, "action": action, "runbook_url": f"{p.runbook}#{anchor}",
                                    **_dashboard(p)}})
    return out


def rules(p: RuleParams = RuleParams()) -> dict:
    return {"groups": [
        {"name": "grpo-recording", "rules": recording_rules(p)},
        {"name": "grpo-health", "rules": health_rules(p)},
        {"name": "grpo-operational", "rules": operational_rules(p)},
    ]}


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, s: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)


_Dumper.add_representer(str, _str)


def render(p: RuleParams = RuleParams()) -> str:
    header = (f"# grpo-sentinel health rules, generated by `grpo-sentinel rules` (telemetry/health/rules.py); do not edit.\n"
              f"# window {duration(p.window)}, for {duration(p.pending)}, max reward {_num(p.max_reward)}, "
              f"grouped by {', '.join(p.group_by)}; "
              "thresholds as in telemetry/health/thresholds.py (the statistics: detectors.py).\n"
              "# Rows the trainer judges itself (PromQL cannot express them) page on grpo_health_condition: "
              "see docs/runbook.md.\n")
    return header + yaml.dump(rules(p), Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)

