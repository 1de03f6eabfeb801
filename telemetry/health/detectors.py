"""One pure, vectorised detector per health-table row, over a RunLog's per-step series.

Each returns the step windows where its condition holds. Windows are in steps (offline) and the
thresholds are relative wherever scales differ between runs: entropy against the run's own early
baseline and ln V, rewards against the maximum achievable, accuracy declines against the
sampling noise of the evaluation set. A row whose signals the log lacks is reported as not
assessable, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from grpo_sentinel.telemetry.health.ingest import RunLog
from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.stats import moving_average, windowed_sd


@dataclass(frozen=True)
class Thresholds:
    window: int = 20  # steps; the trailing window of every smoothed signal
    adv_mean_tol: float = 1e-3  # float32 rounding is ~1e-7; a real bug is >> 1e-3
    nonfinite_run: int = 3  # consecutive non-finite steps that make it critical
    saturated: float = 0.95  # correctness reward / its maximum, window mean
    zero_signal: float = 0.9  # frac_zero_std, window mean
    loss_rolling_factor: float = 10.0  # |loss| vs the mean |loss| of the previous `loss_window` steps
    loss_baseline_factor: float = 100.0  # |loss| vs the median |loss| of the first `loss_window` steps
    loss_window: int = 50
    acc_decline_se: float = 3.5  # accuracy decline (2-point means) that counts, in standard errors
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


WINDOW_COMPLETIONS = 400  # a window mean of 0/1 rewards over 400 samples has SE <= 0.025


def auto_window(completions_per_step: int | None, default: int = 20) -> int:
    """Steps per detector window: enough completions for a stable mean (~400), within 5..100 steps.
    64 completions a step (the demo) -> 7 steps; one prompt x G=8 (the book runs) -> 50."""
    if not completions_per_step:
        return default
    return int(min(100, max(5, math.ceil(WINDOW_COMPLETIONS / completions_per_step))))


@dataclass(frozen=True)
class Condition:
    id: str
    severity: str
    first_step: int
    last_step: int
    evidence: str
    cause: str
    action: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Diagnosis:
    conditions: list[Condition] = field(default_factory=list)
    not_assessable: dict[str, str] = field(default_factory=dict)  # id -> which signal is missing
    entropy_baseline: float = math.nan  # the run's early entropy, which the entropy rows compare with


def _episodes(mask: np.ndarray, steps: np.ndarray, gap: int = 0) -> list[tuple[int, int]]:
    """Runs of True as (first_step, last_step); runs separated by <= gap False rows are merged."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    breaks = np.flatnonzero(np.diff(idx) > gap + 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks], [idx[-1]]])
    return [(int(steps[a]), int(steps[b])) for a, b in zip(starts, ends)]


def _slope(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing change per step of the moving average: (MA[i] - MA[i-w]) / w."""
    ma = moving_average(x, w)
    out = np.full(len(x), np.nan)
    out[w:] = (ma[w:] - ma[:-w]) / w
    return out


def _full(n: int, w: int) -> np.ndarray:
    """True where a trailing window of w steps is complete."""
    return np.arange(n) >= w - 1


class _Ctx:
    def __init__(self, log: RunLog, th: Thresholds):
        self.log, self.th, self.s = log, th, log.series
        self.steps = log.series["step"]
        self.n, self.w = len(log), th.window
        self.diag = Diagnosis()

    def need(self, cid: str, *signals: str) -> bool:
        missing = [s for s in signals if not self.log.has(s)]
        if missing:
            self.diag.not_assessable[cid] = f"the log has no {', '.join(missing)}"
        return not missing

    def ma(self, name: str, w: int | None = None) -> np.ndarray:
        return moving_average(self.s[name], w or self.w)

    def fire(self, cid: str, mask: np.ndarray, evidence, severity: str | None = None, gap: int = 0) -> None:
        row = BY_ID[cid]
        for first, last in _episodes(mask, self.steps, gap):
            i, j = np.searchsorted(self.steps, first), np.searchsorted(self.steps, last)
            self.diag.conditions.append(Condition(cid, severity or row.severity, first, last, evidence(i, j),
                                                  row.cause, row.action))


def diagnose(log: RunLog, th: Thresholds = Thresholds()) -> Diagnosis:
    c = _Ctx(log, th)
    for detector in DETECTORS:
        with np.errstate(invalid="ignore", divide="ignore"):
            detector(c)
    c.diag.conditions.sort(key=lambda k: (k.first_step, k.id))
    return c.diag


# ---------------------------------------------------------------------------------------------
# Detectors: one per row


def adv_mean_drift(c: _Ctx) -> None:
    if c.need("adv_mean_drift", "adv_mean"):
        x = c.s["adv_mean"]
        c.fire("adv_mean_drift", np.abs(x) > c.th.adv_mean_tol,
               lambda i, j: f"|adv_mean| up to {np.nanmax(np.abs(x[i:j + 1])):.2g} (must be ~0; tolerance {c.th.adv_mean_tol:g})")


def nonfinite(c: _Ctx) -> None:
    bad = c.s.get("_nonfinite")
    if bad is None:
        c.diag.not_assessable["nonfinite"] = "the log does not mark non-finite steps"
        return
    runs = _episodes(bad > 0, c.steps)
    for first, last in runs:
        i, j = np.searchsorted(c.steps, first), np.searchsorted(c.steps, last)
        critical = j - i + 1 >= c.th.nonfinite_run
        mask = np.zeros(c.n, dtype=bool)
        mask[i:j + 1] = True
        c.fire("nonfinite", mask, lambda i, j: f"{j - i + 1} step(s) in a row with non-finite loss/gradients (update skipped)",
               severity="critical" if critical else "warning")


def reward_saturated(c: _Ctx) -> None:
    name = "train_acc" if c.log.has("train_acc") else "reward"
    if not c.need("reward_saturated", name):
        return
    scale = 1.0 if name == "train_acc" else c.log.max_reward
    ma = c.ma(name) / scale
    c.fire("reward_saturated", _full(c.n, c.w) & (ma >= c.th.saturated),
           lambda i, j: f"correctness {np.nanmax(ma[i:j + 1]):.2f} of its maximum over {c.w}-step windows")


def signal_vanished(c: _Ctx) -> None:
    if not c.need("signal_vanished", "frac_zero_std"):
        return
    ma = c.ma("frac_zero_std")

    def evidence(i, j):
        text = f"up to {100 * np.nanmax(ma[i:j + 1]):.0f} % of groups without signal over {c.w}-step windows"
        if c.log.has("frac_zero_std_correct"):
            k = i + int(np.nanargmax(ma[i:j + 1]))
            corr, wrong = c.ma("frac_zero_std_correct")[k], c.ma("frac_zero_std_wrong")[k]
            text += f" (all-correct {100 * corr:.0f} %, all-wrong {100 * wrong:.0f} %)"
        return text

    c.fire("signal_vanished", _full(c.n, c.w) & (ma >= c.th.zero_signal), evidence, gap=c.w // 2)


def loss_spike(c: _Ctx) -> None:
    if not c.need("loss_spike", "loss"):
        return
    a = np.abs(c.s["loss"])
    scale = np.where(a > 0, a, np.nan)  # a step without signal has loss exactly 0: it says nothing of the scale
    lw = c.th.loss_window
    prev = np.full(c.n, np.nan)
    prev[1:] = moving_average(scale, lw)[:-1]  # mean |loss| of the previous window, excluding this step
    base = np.nanmedian(scale[:lw]) if np.isfinite(scale[:lw]).sum() >= lw // 5 else np.nan
    rolling = (np.arange(c.n) >= lw) & (a > c.th.loss_rolling_factor * prev)
    baseline = (np.arange(c.n) >= lw) & (a > c.th.loss_baseline_factor * base)
    c.fire("loss_spike", rolling | baseline,
           lambda i, j: f"|loss| up to {np.nanmax(a[i:j + 1]):.3g} vs an early median of {base:.3g}", gap=c.w)


def _accuracy_declines(c: _Ctx) -> list[tuple[int, int, float, float, int]]:
    """Eval points where held-out accuracy fell below its peak beyond sampling noise.

    Accuracy is smoothed over two consecutive eval points (b_k, SE s/sqrt 2 each, s = sqrt(p(1-p)/n)),
    and b_k must sit `acc_decline_se` (3.5) s below the peak of b over the last `acc_lookback` points. The peak of 10-15 noisy
    points is biased upwards by ~1.2 s, so 3 s still paged 1 % of simulated healthy runs
    (tests/zoo.py, 300 seeds) and 3.5 s none. Without n, the decline must reach `acc_unknown_n_floor`.
    Returns (peak_step, row, peak, value, n)."""
    acc = c.s["sample_acc"]
    rows = np.flatnonzero(np.isfinite(acc))
    values, at = acc[rows], c.steps[rows]
    if c.log.baseline_acc is not None and (not len(at) or at[0] > 0):  # the step-0 evaluation
        values, at = np.concatenate([[c.log.baseline_acc], values]), np.concatenate([[0.0], at])
        rows = np.concatenate([[-1], rows])
    if len(values) < 2:
        return []
    b = (values[1:] + values[:-1]) / 2
    n, lookback = c.log.eval_n, c.th.acc_lookback
    padded = np.concatenate([np.full(lookback, -np.inf), b])
    windows = np.lib.stride_tricks.sliding_window_view(padded[:-1], lookback)  # [k] = b[k-L .. k-1]
    peak = np.arange(len(b)) - lookback + windows.argmax(1)
    p = windows.max(1)
    if n:
        noise = np.maximum(c.th.acc_decline_se * np.sqrt(np.maximum(p * (1 - p), 1e-4) / n), c.th.acc_noise_floor)
    else:
        noise = np.full(len(b), c.th.acc_unknown_n_floor)
    hits = np.flatnonzero(p - b >= noise)
    return [(int(at[peak[k] + 1]), rows[k + 1], p[k], b[k], n or 0) for k in hits]


def late_degradation_and_reward_hacking(c: _Ctx) -> None:
    """Both read a held-out accuracy decline; the reward decides which: falling too -> degradation
    (instability), holding or rising -> hacking (the grader pays for something that is not the task)."""
    if not (c.need("late_degradation", "sample_acc", "reward") & c.need("reward_hacking", "sample_acc", "reward")):
        return
    r_ma = c.ma("reward", 2 * c.w)
    r_noise = windowed_sd(c.s["reward"], 2 * c.w) / math.sqrt(2 * c.w)
    for cid in ("late_degradation", "reward_hacking"):
        mask = np.zeros(c.n, dtype=bool)
        notes = {}
        for peak_step, r, p, v, n in _accuracy_declines(c):
            reward_peak = np.nanmax(r_ma[np.searchsorted(c.steps, peak_step):r + 1])
            # A fall is 5 % of the maximum, or a fifth of the reward's own level when that is low,
            # and always beyond the moving mean's noise.
            margin = max(min(c.th.reward_drop * c.log.max_reward, 0.2 * reward_peak), 2 * r_noise[r])
            fell = r_ma[r] < reward_peak - margin
            if fell == (cid == "late_degradation"):
                mask[r] = True
                notes[r] = (f"held-out accuracy (2-point mean) {100 * p:.1f} % at step {peak_step} -> {100 * v:.1f} % "
                            f"(n={n or 'unknown'}); reward (moving mean) {reward_peak:.3f} -> {r_ma[r]:.3f}")
        c.fire(cid, mask, lambda i, j, notes=notes: notes[max(k for k in notes if i <= k <= j)], gap=c.n)


def entropy(c: _Ctx) -> None:
    if not (c.need("entropy_collapse", "entropy", "reward") & c.need("entropy_blowup", "entropy", "reward")):
        c.diag.not_assessable.setdefault("exploration", "the log has no entropy")
        return
    e, w = c.s["entropy"], c.w
    head = e[: max(w, min(c.n // 10, 50))]
    baseline = c.diag.entropy_baseline = float(np.nanmedian(head)) if np.isfinite(head).any() else math.nan
    ma, e_slope, r_slope = c.ma("entropy"), _slope(e, w), _slope(c.s["reward"], w)
    full = _full(c.n, 2 * w)
    flat = np.abs(r_slope * w) < c.th.reward_drop * c.log.max_reward
    c.fire("entropy_collapse", full & (ma < c.th.entropy_collapse * baseline) & (e_slope <= 0) & flat,
           lambda i, j: f"entropy {np.nanmin(ma[i:j + 1]):.3g} vs an early baseline of {baseline:.3g}; reward flat", gap=w)
    near_uniform = ma >= c.th.entropy_blowup_lnv * c.log.ln_vocab if c.log.ln_vocab else np.zeros(c.n, dtype=bool)
    # A ratio alone fires on a tiny baseline (0.1 -> 0.5 nat is "5x" and still a peaked distribution):
    # the rise must also be a real fraction of the way to uniform (1 nat when ln V is unknown).
    rise = c.th.entropy_blowup_rise_lnv * c.log.ln_vocab if c.log.ln_vocab else 1.0
    rising_while_falling = (ma > c.th.entropy_blowup_baseline * baseline) & (ma - baseline > rise) & (r_slope < 0)
    ceiling = f" of ln V = {c.log.ln_vocab:.2f}" if c.log.ln_vocab else ""
    c.fire("entropy_blowup", full & (near_uniform | rising_while_falling),
           lambda i, j: f"entropy {np.nanmax(ma[i:j + 1]):.3g}{ceiling} vs an early baseline of {baseline:.3g}", gap=w)
    signal = c.ma("frac_zero_std") < c.th.exploration_signal if c.log.has("frac_zero_std") else np.ones(c.n, dtype=bool)
    c.fire("exploration", full & (e_slope > 0) & (r_slope > 0) & (ma > c.th.exploration_rise * baseline) & signal,
           lambda i, j: f"entropy rising to {np.nanmax(ma[i:j + 1]):.3g} while reward rises: healthy exploration", gap=w)


def kl(c: _Ctx) -> None:
    for cid, other in (("kl_runaway", "reward"), ("kl_dominant", "frac_zero_std"), ("plateau_kl_flat", "reward")):
        c.need(cid, "kl", other)  # each row records what it lacks
    if not c.log.has("kl"):
        return
    k_ma, k_slope = c.ma("kl"), _slope(c.s["kl"], c.w)
    full = _full(c.n, 2 * c.w)
    if c.log.has("reward"):
        r_slope = _slope(c.s["reward"], c.w)
        c.fire("kl_runaway", full & (k_ma > c.th.kl_bound) & (r_slope < 0),
               lambda i, j: f"KL {np.nanmax(k_ma[i:j + 1]):.3g} per token (bound {c.th.kl_bound:g}) while reward falls", gap=c.w)
        early = np.arange(c.n) < max(2 * c.w, c.n // 3)
        c.fire("plateau_kl_flat", full & early & (k_ma < c.th.kl_flat) & _reward_flat(c),
               lambda i, j: f"KL {np.nanmax(k_ma[i:j + 1]):.2g} (~0) and reward flat early in the run", gap=c.w)
    if c.log.has("frac_zero_std"):
        z = c.ma("frac_zero_std")
        k_before = np.full(c.n, np.nan)
        k_before[2 * c.w:] = k_ma[: -2 * c.w]
        # KL at least doubling within two windows while no group carries signal: the KL term is
        # the only gradient left. A small, slowly growing KL on a saturated task is not this.
        c.fire("kl_dominant", full & (z >= c.th.kl_dominant_zero) & (k_slope > 0) & (k_ma > c.th.kl_dominant_min) & (k_ma > 2 * k_before),
               lambda i, j: f"KL rising to {np.nanmax(k_ma[i:j + 1]):.3g} while {100 * np.nanmin(z[i:j + 1]):.0f} % of groups carry no signal",
               gap=c.w)


def length_pathology(c: _Ctx) -> None:
    if c.log.has("truncation_rate"):
        t = c.ma("truncation_rate")
        pinned = t >= c.th.truncation
        what = lambda i, j: f"{100 * np.nanmax(t[i:j + 1]):.0f} % of completions truncated at max_new_tokens"
    elif c.log.max_new_tokens and c.log.has("response_len"):
        t = c.ma("response_len") / c.log.max_new_tokens
        pinned = t >= 0.9
        what = lambda i, j: f"mean length {100 * np.nanmax(t[i:j + 1]):.0f} % of max_new_tokens={c.log.max_new_tokens}"
    else:
        c.diag.not_assessable["length_pathology"] = "the log has no truncation rate and max_new_tokens is unknown"
        return
    mask = _full(c.n, c.w) & pinned
    if c.log.has("response_len_wrong") and c.log.has("response_len_correct"):
        ratio = c.ma("response_len_wrong") / c.ma("response_len_correct")
        mask |= _full(c.n, c.w) & (ratio > c.th.wrong_longer) & (_slope(c.s["response_len_wrong"], c.w) > 0)
    c.fire("length_pathology", mask, what, gap=c.w)


def _reward_flat(c: _Ctx) -> np.ndarray:
    """Reward change over the last 2 windows below `reward_drop` of the maximum (a least-squares-like
    difference of moving means, so a reward quantised to 1/B still shows a trend)."""
    gain = (c.ma("reward") - moving_average(c.s["reward"], 2 * c.w)) * 2
    return np.abs(gain) < c.th.reward_drop * c.log.max_reward


def plateaus(c: _Ctx) -> None:
    full = _full(c.n, 2 * c.w)
    if c.need("plateau_small_group", "reward", "frac_zero_std"):
        if c.log.group_size is None:
            c.diag.not_assessable["plateau_small_group"] = "the group size G is unknown"
        elif c.log.group_size <= c.th.small_group:
            z = c.ma("frac_zero_std")
            c.fire("plateau_small_group", full & _reward_flat(c) & (z >= c.th.small_group_zero),
                   lambda i, j: f"G = {c.log.group_size}: reward flat, {100 * np.nanmax(z[i:j + 1]):.0f} % of groups without signal",
                   gap=c.w)
    if c.need("plateau_grader_loose", "reward", "train_acc"):
        # What the grader pays vs what the strict verifier accepts *on the same completions*. (Reward vs
        # held-out accuracy would also fire on any train/eval difficulty gap, e.g. both book runs.)
        r = c.ma("reward", 2 * c.w) / c.log.max_reward
        strict = c.ma("train_acc", 2 * c.w)
        kl_ok = c.ma("kl") >= c.th.kl_flat if c.log.has("kl") else np.ones(c.n, dtype=bool)
        c.fire("plateau_grader_loose", full & _reward_flat(c) & kl_ok & (r >= c.th.loose_reward) &
               (r - strict >= c.th.loose_gap),
               lambda i, j: f"reward {np.nanmax(r[i:j + 1]):.2f} of its maximum and flat, while the verifier accepts "
                            f"{100 * strict[j]:.0f} % of the same completions", gap=c.w)
    if c.need("kl_only_learning", "loss", "reward"):
        lo = c.ma("loss", 2 * c.w)
        before = np.full(c.n, np.nan)
        before[2 * c.w:] = lo[: -2 * c.w]
        noise = windowed_sd(c.s["loss"], 2 * c.w) / math.sqrt(2 * c.w)
        # The earlier level must itself stand out of the noise, and the fall be well beyond it: the
        # test runs at every step, so 3 sigma still paged 2 % of simulated healthy runs; 5 sigma none.
        falling = (before > 5 * noise) & (lo < 0.5 * before) & (before - lo > 5 * math.sqrt(2) * noise)
        hit = _full(c.n, 4 * c.w) & falling & _reward_flat(c)
        # One spike inflates a window mean, and the window after it then "falls": the medians must
        # fall too. Checked only where the means fall, so a long healthy log costs nothing.
        i = np.flatnonzero(hit)
        if i.size:
            windows = np.lib.stride_tricks.sliding_window_view(c.s["loss"], 2 * c.w)  # [k] = steps k .. k+2w-1
            hit[i] = np.nanmedian(windows[i - 2 * c.w + 1], 1) < 0.5 * np.nanmedian(windows[i - 4 * c.w + 1], 1)
        c.fire("kl_only_learning", hit,
               lambda i, j: f"loss (moving mean) {np.nanmax(before[i:j + 1]):.3g} -> {np.nanmin(lo[i:j + 1]):.3g} "
                            "while reward is flat", gap=c.w)


DETECTORS = [adv_mean_drift, nonfinite, reward_saturated, signal_vanished, loss_spike,
             late_degradation_and_reward_hacking, entropy, kl, length_pathology, plateaus]
