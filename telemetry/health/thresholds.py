"""The detectors' thresholds and windows: every number a health row compares against, with why that
value, the domain each may be set in (`grpo-sentinel rules --set`, health.thresholds in a config), and
the window rules (`auto_window`: ~400 completions a window; `detector_window`: the configured one first).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Thresholds:
    window: int = 20  # steps; the trailing window of every smoothed signal
    early_windows: int = 2  # the run's early statistics come from its first early_windows windows (>= 10 steps)
    adv_mean_tol: float = 1e-3  # float32 rounding is ~1e-7; a real bug is >> 1e-3
    nonfinite_run: int = 3  # consecutive non-finite steps that make it critical
    saturated: float = 0.95  # correctness reward / its maximum, window mean
    zero_signal: float = 0.9  # frac_zero_std, window mean
    loss_spike_factor: float = 100.0  # |loss| vs the median |loss| of the `loss_window` steps before (see loss_spike)
    loss_window: int = 50  # steps of a loss reference block (the loss rows compare with earlier blocks)
    acc_decline_rate: float = 1e-5  # false held-out declines a step (as loss_blowup_arl): sets the SEs a decline needs
    acc_lookback: int = 10  # eval points the peak is taken over (the max of ever more points drifts up)
    acc_noise_floor: float = 0.03  # smallest accuracy decline that counts, whatever n is
    acc_unknown_n_floor: float = 0.05  # ... when the eval set size is unknown
    reward_drop: float = 0.05  # a reward decline that counts, as a fraction of max reward
    entropy_collapse: float = 0.3  # window entropy below this fraction of the early baseline
    entropy_blowup_lnv: float = 0.8  # window entropy above this fraction of ln V
    entropy_blowup_baseline: float = 3.0  # ... or this multiple of the baseline while reward falls
    entropy_blowup_rise_lnv: float = 0.1  # ... and at least this fraction of ln V above it (1 nat if V is unknown)
    exploration_rise: float = 1.5  # entropy this multiple of its baseline, rising with the reward
    exploration_signal: float = 0.5  # ... while fewer groups than this are without signal
    kl_bound: float = 1.0  # per-token k3 KL, window mean
    kl_flat: float = 1e-3  # "KL ~ 0"
    kl_dominant_min: float = 0.05
    kl_dominant_zero: float = 0.95  # frac_zero_std at which no group is left to learn from
    small_group: int = 4  # G at or below which group statistics are too noisy
    small_group_zero: float = 0.4  # frac_zero_std that counts as high for G <= 4 (p^4 + (1-p)^4 >= 1/8 always)
    loose_gap: float = 0.3  # reward (as a fraction of max) above held-out accuracy
    loose_reward: float = 0.7  # reward (as a fraction of max) that counts as high
    truncation: float = 0.5  # window truncation rate
    wrong_longer: float = 1.5  # wrong answers this much longer than right ones
    # Leading indicators (sequential tests).
    cusum_h: float = 8.0  # CUSUM threshold in noise sds: ARL0 >= ~19,000 steps (Siegmund, k >= 0.5)
    loss_blowup_factor: float = 10.0  # an exceedance: |loss| above this multiple of its early median (an order of magnitude)
    loss_blowup_share: float = 0.5  # the share of updates beyond the early range the test is built to detect
    loss_blowup_arl: float = 1e5  # updates between false alarms at worst (Wald: h = ln ARL0)
    entropy_drift: float = 0.25  # entropy rise above its early baseline worth a warning, as a fraction of it
    length_drift: float = 0.25  # mean length rising this fraction of the way from its early level to the cap (the
    # CUSUM's allowance is half of it). 0.5 before the seventh pass paged 10 to 20 steps later; the capped share
    # rising beyond its noise, not the length alone, tells a creep to the cap from a run learning to reason longer
    correctness_drop: float = 0.1  # relative fall of training correctness below its peak that matters (as damage)
    correctness_lookback: int = 10  # 2w-windows the training correctness peak is taken over (an all-time max drifts up)
    all_wrong_rise: float = 0.2  # rise of the share of all-wrong groups above its early level
    kl_accel: float = 1.25  # KL growth over the last window at least this multiple of the window before's (held 4 windows)
    kl_accel_min: float = 0.05  # KL (window mean) below which its growth is not reported
    kl_growth: float = 2.0  # kl_runaway needs the KL this multiple of the run's own early KL: a KL that starts high
    # (an SFT start measured against the base model) and stays there is kl_offset
    no_progress_windows: int = 10  # windows of history before "the reward never rose" is judged (see no_progress)
    no_progress_z: float = 3.0  # the rise that counts, in standard errors of a difference of two window means
    grad_spike: float = 10.0  # gradient norm this multiple of the median of the previous `loss_window` steps
    clip_imbalance: float = 4.0  # one side of the ratio clip active this multiple of the other's
    clip_imbalance_min: float = 0.005  # ... while that side clips at least this share of tokens
    truncation_capped: float = 0.9  # window truncation rate at which almost no completion ends: critical
    escalate_windows: int = 1  # a drift row's warning held this many windows, getting worse: critical (_escalate)
    forecast_windows: int = 7  # horizon H: a drift row whose signal's trend reaches its failure level within this
    # many windows is critical at once (detectors._forecast; 140 steps at the default window). A trend that will stop
    # pages as one that will not, more often the further it is continued: 7 is the shortest H at which the seen slow
    # shapes of each kind (lengths, KL) keep a mean lead >= 20 steps on at least half of them (eleventh pass; 10 before)
    repetition: float = 0.3  # window mean seq-rep-4 (repeated word 4-grams): human text ~0.01, degenerate loops ~0.4
    # Floors: the scale below which a relative change is not a change. A loss or gradient norm that grows 1000x from
    # 1e-8 is float32 rounding of a zero-signal step (every group all-same: advantages 0, the loss is beta x a KL of
    # ~1e-6, the gradient the same), not a numerical event; real runs' |loss| and gradient norms sit at 1e-4 to 10.
    # loss_spike, loss_blowup and grad_norm_spike judge nothing against a reference below its floor: from no scale,
    # any rise is "100x".
    loss_floor: float = 1e-5  # |loss|
    grad_floor: float = 1e-5  # gradient norm
    # loss_spike's critical stage: one update this many times the median |loss| of the block before (four orders of
    # magnitude: under a Student t3 tail ~5e-12 a step, never by chance; a 6e11 loss:sum among losses of ~1 is one)
    loss_catastrophe: float = 1e4
    # policy_collapse: every group without signal (frac_zero_std at least this, every step of a window) and the
    # step's reward the same from step to step (its window sd at most `collapse_reward_sd` of the maximum) after the
    # run had signal (its early frac_zero_std below `zero_signal`): one answer for every prompt
    collapse_zero: float = 0.99
    collapse_reward_sd: float = 0.01
    # train_inference_mismatch, on the token-mean k3 between the sampler's and the trainer's log-probs (mismatch_kl).
    # Warning: its window mean `mismatch_rise` times the run's early level and beyond that level's noise, and at least
    # `mismatch_floor` (a healthy bf16 sampler sits at 1e-4 to 1e-3; two float32 paths at ~1e-13, where a 100x rise is
    # still nothing). Critical: its window mean at `mismatch_critical`, where runs are reported collapsed (verl's
    # rollout_corr health check flags |kl| > 0.1 as "significant off-policy gap"; Qi et al. 2025 show bf16 runs' mismatch
    # KL rising from ~1e-3 to ~1 as they collapse), or one step `mismatch_jump` times the median of the window
    # before and at least `mismatch_jump_floor`: a sampler out of sync with the weights (a skipped adapter hand-over).
    mismatch_floor: float = 1e-4
    mismatch_rise: float = 2.0
    mismatch_critical: float = 0.1
    mismatch_jump: float = 10.0
    mismatch_jump_floor: float = 1e-3


# The domain of every threshold (`grpo-sentinel rules --set` and the config check it): a value
# outside it makes a rule that never or always fires.
_FRACTION = ("saturated", "zero_signal", "collapse_zero", "collapse_reward_sd", "reward_drop", "entropy_collapse",
             "entropy_blowup_lnv", "entropy_blowup_rise_lnv", "exploration_signal", "kl_dominant_zero",
             "small_group_zero", "loose_gap", "loose_reward", "truncation", "entropy_drift", "length_drift",
             "correctness_drop", "all_wrong_rise", "loss_blowup_share", "clip_imbalance_min", "truncation_capped",
             "repetition", "acc_decline_rate")
_ABOVE_ONE = ("loss_spike_factor", "loss_catastrophe", "mismatch_rise", "mismatch_jump", "entropy_blowup_baseline",
              "exploration_rise", "wrong_longer", "loss_blowup_factor", "kl_accel", "loss_blowup_arl", "kl_growth",
              "grad_spike", "clip_imbalance")
_COUNTS = {"window": 2, "early_windows": 1, "nonfinite_run": 1, "loss_window": 5, "acc_lookback": 1, "small_group": 2,
           "correctness_lookback": 1, "no_progress_windows": 2,
           "escalate_windows": 1, "forecast_windows": 1}


def threshold_error(name: str, value: float) -> str | None:
    """Why `value` is outside `name`'s domain, or None."""
    if not math.isfinite(value):
        return f"{name} must be a finite number"
    if name in _COUNTS and value < _COUNTS[name]:
        return f"{name} must be a whole number >= {_COUNTS[name]}"
    if name in _FRACTION and not 0 < value <= 1:
        return f"{name} is a fraction of its scale: give a number in (0, 1]"
    if name in _ABOVE_ONE and value <= 1:
        return f"{name} is a multiple: give a number > 1"
    if value <= 0:
        return f"{name} must be > 0"
    return None


def validate(th: Thresholds) -> list[str]:
    return [e for f in fields(th) if (e := threshold_error(f.name, float(getattr(th, f.name))))]


_DEFAULTS = Thresholds()
_NAMES = [f.name for f in fields(Thresholds)]


def coerce(name: str, value) -> int | float:
    """`value` (a number or its text) as threshold `name` holds it: a whole number for a count, else a
    float, inside its domain. ValueError saying what to write (`grpo-sentinel rules --set`, health.thresholds)."""
    if name not in _NAMES:
        close = difflib.get_close_matches(name, _NAMES, n=1)
        raise ValueError(f"unknown threshold {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    kind = type(getattr(_DEFAULTS, name))
    try:
        x = float(value)
        if not math.isfinite(x) or (kind is int and not x.is_integer()):
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} is not a {'whole number' if kind is int else 'number'}") from None
    error = threshold_error(name, x)
    if error:
        raise ValueError(f"{name}={value!r}: {error}")
    return kind(x)


def parse_settings(settings: list[str]) -> dict[str, int | float]:
    """NAME=VALUE texts (a benchmark's `--set`) as {name: value}, each checked as `coerce` checks it."""
    changed = {}
    for text in settings:
        name, eq, value = text.partition("=")
        if not eq:
            raise ValueError(f"{text!r}: write NAME=VALUE, e.g. forecast_windows=5")
        if name == "window":  # each log's own (detector_window), as health.window is a run's
            raise ValueError("the detector window is each log's own, not a threshold to set")
        changed[name] = coerce(name, value)
    return changed


def configured(window: int, changed: Mapping[str, float] | None = None) -> Thresholds:
    """The thresholds a run's detectors use: the defaults, its window, and what its config changed
    (health.thresholds, kept in run.json), each checked as `coerce` checks it."""
    return Thresholds(window=window, **{name: coerce(name, v) for name, v in (changed or {}).items()})


WINDOW_COMPLETIONS = 400  # a window mean of 0/1 rewards over 400 samples has SE <= 0.025


def auto_window(completions_per_step: int | None, default: int = 20) -> int:
    """Steps per detector window: enough completions for a stable mean (~400), within 5..100 steps.
    64 completions a step (the demo) -> 7 steps; one prompt x G=8 (the book runs) -> 50."""
    if not completions_per_step:
        return default
    return int(min(100, max(5, math.ceil(WINDOW_COMPLETIONS / completions_per_step))))


def detector_window(configured: int | None, completions_per_row: float | None) -> int:
    """The detectors' window in record rows: the configured one, else ~400 completions' worth
    (auto_window; 20 rows when the completions per row are unknown)."""
    return configured or auto_window(round(completions_per_row) if completions_per_row else None)


def early_steps(th: Thresholds) -> int:
    """Rows the early statistics are taken from: the first `early_windows` windows, at least 10."""
    return max(th.early_windows * th.window, 10)


# Windows back that kl_acceleration's forecast counts the KL's rises over (the default H): a fixed number, so the
# recording rules do not depend on a threshold that a Helm value may set.
KL_RISING_WINDOWS = 10


def lookback(th: Thresholds) -> int:
    """Rows before a step that any detector reads (the online monitor keeps this many, and the early rows)."""
    # loss_blowup's reference: 2-3 blocks back; kl_acceleration's forecast: KL_RISING_WINDOWS + 1 window means
    return max((KL_RISING_WINDOWS + 1) * th.window, 3 * th.loss_window, early_steps(th)) + 2
