"""One pure, vectorised detector per health-table row, over a RunLog's per-step series.

Each returns the step windows where its condition holds. Windows are in steps (offline) and the
thresholds are relative wherever scales differ between runs: entropy against the run's own early
baseline and ln V, rewards against the maximum achievable, accuracy declines against the
sampling noise of the evaluation set, the loss against its own early range. A row whose signals
the log lacks is reported as not assessable, never guessed.

Every detector is causal: its verdict at a step reads only that step and earlier ones. What it
needs from further back than a few windows is carried state: the run's early statistics (fixed
once its first `early_steps` steps are in), the CUSUM statistics, the running peaks and the
recent evaluation points. So `diagnose(log)` over a whole log and the online monitor, which
evaluates one step at a time over a bounded tail of rows plus that state, give the same verdicts,
and the monitor's cost per step does not grow with the run (`diagnose(..., start=, state=, offset=)`).

Leading indicators (the rows that page before the damage) are sequential change-point tests: a
one-sided CUSUM of the signal's excess over its early level, in units of its own early noise,
with an allowance k of half the shift worth reporting (never below half a noise sd) and a
threshold h set by the false-alarm rate (`cusum_h`: ARL0 ~ 19,000 steps at k = 0.5 for Gaussian
noise, longer for any larger k). The loss, whose distribution is heavy-tailed, gets a
distribution-free test instead: exceedances of its early maximum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from grpo_sentinel.telemetry.health.runlog import RunLog
from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.health.thresholds import KL_RISING_WINDOWS, Thresholds, early_steps
from grpo_sentinel.telemetry.stats import cusum, diff_noise, moving_average, trailing_max, windowed_sd


@dataclass(frozen=True)
class Condition:
    id: str
    severity: str
    first_step: int
    last_step: int
    evidence: str
    cause: str
    action: str
    generations: str = ""  # the Langfuse trace (link, or id) of the generations behind it, when the run was traced

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Diagnosis:
    conditions: list[Condition] = field(default_factory=list)
    not_assessable: dict[str, str] = field(default_factory=dict)  # id -> which signal is missing
    entropy_baseline: float = math.nan  # the run's early entropy, which the entropy rows compare with
    masks: dict[str, np.ndarray] = field(default_factory=dict)  # id -> [N] rows where it holds (before episodes merge gaps)


def _episodes(mask: np.ndarray, steps: np.ndarray, gap: int = 0) -> list[tuple[int, int]]:
    """Runs of True as (first_step, last_step); runs separated by <= gap False rows are merged."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    breaks = np.flatnonzero(np.diff(idx) > gap + 1)
    starts = np.concatenate([[idx[0]], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks], [idx[-1]]])
    return [(int(steps[a]), int(steps[b])) for a, b in zip(starts, ends)]


def _shift(x: np.ndarray, k: int) -> np.ndarray:
    """x[i - k] at i (NaN where i < k)."""
    out = np.full(len(x), np.nan)
    if k < len(x):
        out[k:] = x[: len(x) - k]
    return out


class _Ctx:
    """What a detector reads: the rows (the whole log, or the monitor's tail), which of them to judge
    (`start` on), where they sit in the run (`offset`: the absolute index of row 0) and the state
    carried from the rows before (early statistics, CUSUMs, peaks, evaluation points)."""

    def __init__(self, log: RunLog, th: Thresholds, start: int = 0, state: dict | None = None, offset: int = 0):
        self.log, self.th, self.s = log, th, log.series
        self.steps = log.series["step"]
        self.n, self.w = len(log), th.window
        self.start, self.offset = start, offset
        self.state = {} if state is None else state
        self.row = offset + np.arange(self.n)  # absolute row index in the run
        self.E = early_steps(th)
        self.diag = Diagnosis()
        self._ma: dict[tuple, np.ndarray] = {}
        self._has: dict[str, bool] = {}

    def has(self, name: str) -> bool:
        """RunLog.has, once per series (every detector asks)."""
        if name not in self._has:
            self._has[name] = self.log.has(name)
        return self._has[name]

    def slope(self, name: str) -> np.ndarray:
        """Trailing change per step of the w moving mean, (MA[i] - MA[i-w]) / w (from the cached mean)."""
        ma = self.ma(name)
        return (ma - _shift(ma, self.w)) / self.w

    def sd(self, name: str, w: int) -> np.ndarray:
        """Trailing windowed sd of a series, once per series and window."""
        key = (name, w, "sd")
        if key not in self._ma:
            self._ma[key] = windowed_sd(self.s[name], w)
        return self._ma[key]

    def need(self, cid: str, *signals: str) -> bool:
        missing = [s for s in signals if not self.has(s)]
        if missing:
            self.diag.not_assessable[cid] = f"the log has no {', '.join(missing)}"
        return not missing

    def ma(self, name: str, w: int | None = None) -> np.ndarray:
        """Trailing moving mean of a series (computed once per series and window: detectors share them)."""
        key = (name, w or self.w)
        if key not in self._ma:
            self._ma[key] = moving_average(self.s[name], key[1])
        return self._ma[key]

    def full(self, rows: int) -> np.ndarray:
        """True where the run has at least `rows` rows up to here (a trailing window of `rows` is complete)."""
        return self.row >= rows - 1

    def early(self, key: str, rows: int, fn):
        """fn(the first `rows` rows of the run), computed once the run has them and then carried.
        None before that: a causal detector cannot judge against a baseline it does not have yet."""
        if key not in self.state:
            if self.offset > 0 or self.n < rows:
                return None
            self.state[key] = fn(slice(0, rows))
        return self.state[key]

    def cusum(self, key: str, increments: np.ndarray) -> np.ndarray:
        """CUSUM over the judged rows, continuing from the carried value; 0 before `start`."""
        out = np.zeros(self.n)
        if self.start < self.n:
            out[self.start:] = cusum(increments[self.start:], self.state.get(key, 0.0))
            self.state[key] = float(out[-1])
        return out

    def run_length(self, key: str, mask: np.ndarray) -> np.ndarray:
        """Consecutive True rows ending at each judged row (0 where False, and before `start`),
        continuing the run carried from the rows before."""
        out = np.zeros(self.n)
        b = mask[self.start:].astype(bool)
        if len(b):
            idx = np.arange(len(b))
            reset = np.maximum.accumulate(np.where(~b, idx, -1))
            out[self.start:] = np.where(b, idx - reset + np.where(reset < 0, self.state.get(key, 0.0), 0.0), 0.0)
            self.state[key] = float(out[-1])
        return out

    def trailing_max(self, key: str, x: np.ndarray, m: int) -> np.ndarray:
        """Max of x over the trailing m rows (NaN ignored) at the judged rows; the last m - 1 values
        before `start` are carried (a bounded state: m is a few windows, not the run)."""
        out = np.full(self.n, np.nan)
        if self.start < self.n:
            prior = self.state.get(key, np.zeros(0))
            seg = np.concatenate([prior, x[self.start:]])
            out[self.start:] = trailing_max(seg, m)[len(prior):]
            self.state[key] = seg[len(seg) - (m - 1):] if m > 1 else np.zeros(0)
        return out

    def fire(self, cid: str, mask: np.ndarray, evidence, severity: str | None = None, gap: int = 0) -> None:
        row = BY_ID[cid]
        mask = mask.copy()
        mask[: self.start] = False
        self.diag.masks[cid] = self.diag.masks[cid] | mask if cid in self.diag.masks else mask
        for first, last in _episodes(mask, self.steps, gap):
            i, j = np.searchsorted(self.steps, first), np.searchsorted(self.steps, last)
            self.diag.conditions.append(Condition(cid, severity or row.severity, first, last, evidence(i, j),
                                                  row.cause, row.action))


def unjudgeable(log: RunLog, th: Thresholds) -> str | None:
    """Why the log says nothing either way, or None: without a reward (or the verifier's acceptance)
    no row that reads learning can hold, and with fewer rows than two windows no windowed row can;
    "no condition found" would then claim a health the log cannot show."""
    if not (log.has("reward") or log.has("train_acc")):
        return "no reward was read (see the ingest notes for the columns ignored)"
    if len(log) < 2 * th.window:
        return f"{len(log)} rows, fewer than two {th.window}-step windows"
    return None


def diagnose(log: RunLog, th: Thresholds = Thresholds(), start: int = 0, state: dict | None = None,
             offset: int = 0) -> Diagnosis:
    """The health table over `log`. Offline: the defaults. Online (the monitor): the run's last rows,
    `start` = the row to judge, `state` carried between calls, `offset` = rows of the run before these."""
    c = _Ctx(log, th, start, state, offset)
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
    # The run of consecutive bad steps ending at each judged row: a warning while it is short,
    # critical from the `nonfinite_run`-th bad step in a row on.
    run = c.run_length("nonfinite_run", bad > 0)

    def evidence(i, j):
        return f"{int(run[j])} step(s) in a row with non-finite loss/gradients (update skipped)"

    c.fire("nonfinite", (run > 0) & (run < c.th.nonfinite_run), evidence, severity="warning")
    c.fire("nonfinite", run >= c.th.nonfinite_run, evidence, severity="critical")


def _correctness(c: _Ctx) -> tuple[str, float] | None:
    """The series correctness is judged on, and its maximum: the verifier's acceptance (train_acc) or
    a correctness reward component; the combined reward only when it is the correctness (its maximum known)."""
    if c.has("train_acc"):
        return "train_acc", 1.0
    if c.has("reward") and c.log.reward_scale_known and c.log.reward_is_correctness and not c.has("reward_aux"):
        return "reward", c.log.max_reward
    return None


def reward_saturated(c: _Ctx) -> None:
    judged = _correctness(c)
    if judged is None:
        c.diag.not_assessable["reward_saturated"] = (
            "the log has no correctness signal (train_acc or a correctness reward component), and its combined "
            "reward includes auxiliary components or exceeds 1" if c.has("reward") else "the log has no reward")
        return
    name, scale = judged
    ma = c.ma(name) / scale
    c.fire("reward_saturated", c.full(c.w) & (ma >= c.th.saturated),
           lambda i, j: f"correctness ({name}) {np.nanmax(ma[i:j + 1]):.2f} of its maximum over {c.w}-step windows")


def signal_vanished(c: _Ctx) -> None:
    if not c.need("signal_vanished", "frac_zero_std"):
        return
    ma = c.ma("frac_zero_std")

    def evidence(i, j):
        text = f"up to {100 * np.nanmax(ma[i:j + 1]):.0f} % of groups without signal over {c.w}-step windows"
        if c.has("frac_zero_std_correct"):
            k = i + int(np.nanargmax(ma[i:j + 1]))
            corr, wrong = c.ma("frac_zero_std_correct")[k], c.ma("frac_zero_std_wrong")[k]
            text += f" (all-correct {100 * corr:.0f} %, all-wrong {100 * wrong:.0f} %)"
        return text

    c.fire("signal_vanished", c.full(c.w) & (ma >= c.th.zero_signal), evidence, gap=c.w // 2)


def policy_collapse(c: _Ctx) -> None:
    """One answer for every prompt: every group without signal on every step of a window (frac_zero_std
    >= `collapse_zero`) and the step's reward the same from step to step (its window sd within
    `collapse_reward_sd` of the maximum: prompts of every difficulty get the same outcome), after the run
    had signal (its early frac_zero_std below `zero_signal`; a run without signal from the start is
    signal_vanished's reading). Not when every group is right (success: reward_saturated). From then on
    nothing is learned (advantages 0, the loss exactly 0) while the run looks calm: a policy that learned to
    always refuse, then to always authorize, pays the same reward at every step."""
    if not c.need("policy_collapse", "frac_zero_std", "reward"):
        return
    z = c.s["frac_zero_std"]
    early = c.early("collapse_early", c.E, lambda rows: float(np.nanmean(z[rows])))
    if early is None or not early < c.th.zero_signal:
        return
    every = moving_average((z >= c.th.collapse_zero).astype(float), c.w) >= 1 - 1e-9
    sd = c.sd("reward", c.w) / c.log.max_reward
    if c.has("frac_zero_std_correct"):
        right = c.ma("frac_zero_std_correct") >= c.th.collapse_zero
    else:
        right = c.ma("reward") >= c.th.saturated * c.log.max_reward
    loss = c.s.get("loss")

    def evidence(i, j):
        zero_loss = loss is not None and np.all(loss[max(0, j - c.w + 1):j + 1] == 0)
        return (f"every group without signal on every step of {c.w}-step windows and the step's reward "
                f"{c.ma('reward')[j]:.3g} the same from step to step (sd {sd[j] * c.log.max_reward:.2g}), after "
                f"{100 * early:.0f} % of groups without signal early in the run: one answer for every prompt"
                + ("; the loss is exactly 0" if zero_loss else ""))

    c.fire("policy_collapse", c.full(c.w) & every & (sd <= c.th.collapse_reward_sd) & ~right, evidence, gap=c.w)


def _loss_scale(c: _Ctx) -> np.ndarray:
    """[N] |loss|, NaN where it is 0 or not finite: a step without signal has loss exactly 0 and says
    nothing of the scale."""
    a = np.abs(c.s["loss"])
    return np.where(np.isfinite(a) & (a > 0), a, np.nan)


def _loss_blocks(c: _Ctx, lag: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count, median, max) of the non-zero |loss| in a reference block, at every row: the run's rows cut
    into blocks of `loss_window` steps (by absolute row, so the monitor's tail cuts them as the whole
    log does), and row t in block b reads block max(b - lag, 0). NaN where that block is not complete
    in these rows. The loss's scale moves over a healthy run (longer completions, a warm-up): its
    rows compare with the recent past, not with the first steps. A step without signal has loss
    exactly 0: it says nothing of the scale. Per block, not per row: one median per `loss_window` rows."""
    lw = c.th.loss_window
    if "loss_blocks" not in c._ma:
        a = _loss_scale(c)
        head = int(c.row[0] % lw) if c.n else 0  # rows of the first block that lie before these rows
        nb = -(-(head + c.n) // lw)
        blocks = np.sort(np.concatenate([np.full(head, np.nan), a, np.full(nb * lw - head - c.n, np.nan)]).reshape(nb, lw), 1)
        count = np.isfinite(blocks).sum(1)  # [nb]; the NaNs sort last
        k = np.maximum(count, 1)[:, None]
        mid = np.take_along_axis(blocks, np.concatenate([(k - 1) // 2, k // 2], 1), 1).mean(1)  # the median
        top = np.take_along_axis(blocks, k - 1, 1)[:, 0]
        complete = np.ones(nb, dtype=bool)
        complete[0] &= head == 0
        complete[-1] &= (head + c.n) % lw == 0
        c._ma["loss_blocks"] = (count.astype(float), np.where(count > 0, mid, np.nan), np.where(count > 0, top, np.nan),
                                complete)
        c._ma["loss_blocks_sorted"] = blocks  # [nb, loss_window], NaNs last
    count, med, top, complete = c._ma["loss_blocks"]
    nb = len(count)
    ref = np.maximum(c.row // lw - lag, 0) - (c.row[0] // lw if c.n else 0)  # [N] index into the blocks
    ok = (ref >= 0) & complete[np.clip(ref, 0, nb - 1)]

    def pick(v):
        return np.where(ok, v[np.clip(ref, 0, nb - 1)], np.nan)

    return pick(count), pick(med), pick(top)


def _loss_share_above(c: _Ctx, lag: int, x: np.ndarray) -> np.ndarray:
    """[N] how many non-zero |loss| of the reference block (as _loss_blocks(c, lag)) lie above x[row]."""
    blocks, lw = c._ma["loss_blocks_sorted"], c.th.loss_window
    first = c.row[0] // lw if c.n else 0
    ref = np.clip(np.maximum(c.row // lw - lag, 0) - first, 0, len(blocks) - 1)  # [N] index into the blocks
    out = np.zeros(c.n)
    for a in range(0, c.n, 1 << 14):  # [rows, loss_window] comparisons a chunk at a time (a bounded memory)
        out[a:a + (1 << 14)] = np.sum(blocks[ref[a:a + (1 << 14)]] > x[a:a + (1 << 14), None], axis=1)  # NaN: False
    return out


def _loss_lag(c: _Ctx, lag: int) -> np.ndarray:
    """[N] steps from the centre of the row's reference block (as _loss_blocks(c, lag)) to the row."""
    lw = c.th.loss_window
    return c.row - (np.maximum(c.row // lw - lag, 0) * lw + (lw - 1) / 2)


def _loss_so_far(c: _Ctx) -> tuple[np.ndarray, np.ndarray]:
    """[N] (count, median) of the non-zero |loss| from the start of the row's own `loss_window` block to
    the row, at the judged rows (0 and NaN elsewhere, and where that block began before these rows: the
    monitor's tail)."""
    lw = c.th.loss_window
    a = _loss_scale(c)
    count, med = np.zeros(c.n), np.full(c.n, np.nan)
    i = np.arange(c.start, c.n)
    k0 = i - c.row[i] % lw  # each row's block start, in these rows
    i, k0 = i[k0 >= 0], k0[k0 >= 0]
    cols = k0[:, None] + np.arange(lw)  # [rows, lw]: the block's rows, those after the row masked
    block = np.where(cols <= i[:, None], a[np.minimum(cols, c.n - 1)], np.nan)
    count[i] = np.isfinite(block).sum(1)
    some = count[i] > 0
    med[i[some]] = np.nanmedian(block[some], axis=1)
    return count, med


def _loss_rate_falls(c: _Ctx) -> np.ndarray:
    """[N] the |loss| scale's relative growth rate falling: log(median so far in this block / the last
    block's median) per step, over the steps between their centres, below log(last block's median / the
    one before's) per `loss_window` steps. Read from at least w updates of the row's block; False where
    it cannot be read (the test then stays as it was)."""
    lw = c.th.loss_window
    _, m1, _ = _loss_blocks(c, 1)
    _, m0, _ = _loss_blocks(c, 2)
    k, mp = _loss_so_far(c)
    with np.errstate(divide="ignore", invalid="ignore"):
        before = np.log(m1 / m0) / lw
        d = (c.row % lw) / 2 + (lw + 1) / 2  # the centre of the rows so far minus the last block's centre
        now = np.log(mp / m1) / d
    # Blocks 0 and 1 have no two distinct blocks before them (_loss_blocks clamps at block 0).
    return (c.row // lw >= 2) & (k >= c.w) & np.isfinite(before) & np.isfinite(now) & (now < before)


def loss_spike(c: _Ctx) -> None:
    """One update whose |loss| is `loss_spike_factor` (100) times the median |loss| of the block before:
    two orders of magnitude over the loss's recent scale, which a median tracks and one spike does
    not move. Why 100: the GRPO loss is heavy-tailed; for a Student t with 3 degrees of freedom (the
    heaviest tail with a finite variance worth assuming) P(|T| > 100 x its median |T|) = 5e-6 a step,
    one false warning in 200,000 steps; 10x, the earlier factor, is 5e-3 a step (27 % of healthy
    300-step runs warned). Critical at `loss_catastrophe` (1e4) times it: four orders of magnitude in one
    update, which no tail gives by chance (a run whose loss:sum reached 6e11 at one step). Neither where
    the median is below `loss_floor`: a loss that was ~1e-8 (every group without signal) sets no scale."""
    if not c.need("loss_spike", "loss"):
        return
    a = np.abs(c.s["loss"])
    n, med, _ = _loss_blocks(c, 1)
    # A median below the floor (~1e-8: steps without signal, float32 rounding) is no scale to be 100x of.
    judged = (c.row >= c.th.loss_window) & (n >= 5) & (med >= c.th.loss_floor)
    catastrophic = judged & (a > c.th.loss_catastrophe * med)

    def evidence(i, j):
        factor = c.th.loss_catastrophe if catastrophic[i:j + 1].any() else c.th.loss_spike_factor
        return (f"|loss| up to {np.nanmax(a[i:j + 1]):.3g}, over {factor:g}x the median {np.nanmin(med[i:j + 1]):.3g} of "
                f"the {c.th.loss_window} steps before")

    c.fire("loss_spike", judged & (a > c.th.loss_spike_factor * med) & ~catastrophic, evidence, severity="warning", gap=c.w)
    c.fire("loss_spike", catastrophic, evidence, severity="critical", gap=c.w)


def loss_blowup(c: _Ctx) -> None:
    """Sustained, not one spike: a Bernoulli CUSUM on 'this update's |loss| is above T', where T is
    the larger of a reference block's maximum and `loss_blowup_factor` (10) x its median; the
    reference is the block two before the update's own (`loss_window` = 50 steps a block, so 51-149
    steps back): a blow-up is the loss's scale growing an order of magnitude within ~100 steps, a
    drift a healthy run does not make (tests/zoo.py's `report_growing_x10` grows tenfold over 300
    steps, quadratically, at most 2.6x in any 100).

    Under 'nothing changed' a new |loss| exceeds the maximum of the n0 non-zero values of the block
    with probability 1/(n0+1) whatever its distribution (exchangeability). But the null a healthy run
    needs is not 'nothing changed': its scale may grow, at up to half an order of magnitude (sqrt 10,
    3.2x) per 100 steps; at 10x the median, a half-normal loss grown 3x exceeds T at 3 % of updates,
    a t3 one at 8 %, far above 1/(n0+1) = 2 %, and the test alarmed on them. So p0 is the exceedance
    rate such a growth would give, read from the reference block itself (exchangeability again): the
    share of its values above T / g, g = sqrt 10 ^ (lag / 100), lag = the steps from the reference
    block's centre to the update (75-125), plus one, over n0 + 1 (at most 0.45). A rate, not one
    factor for the span (third pass): a scale growing 20x over 300 steps, exponentially (2.7x per 100
    steps, zoo `new_loss_exp_x20`), grows 4x between the block's centre and the last rows of the
    block two after it, past sqrt 10, and paged 3 of 300 runs. Why half an order of magnitude per 100
    steps is the healthy bound: the GRPO loss is the advantage-weighted ratio term, whose scale
    normalised advantages fix, plus beta KL, whose scale follows the KL; a KL growing 10x over a few
    hundred steps is a healthy run's (the zoo's healthy KL grows 25x over 300, mostly early) and a
    blow-up is 10x in tens of steps (zoo `loss_blowup`: 10x every ~30). The test is built to
    detect a share p1 = `loss_blowup_share` (half the updates: at a tenfold scale, half of them pass
    10x the old median), or twice p0. Its log-likelihood ratio accumulates log(p1/p0) per exceedance
    and log((1-p1)/(1-p0)) per other non-zero update; by Wald's bound it alarms by chance at most once in e^h updates,
    h = ln(`loss_blowup_arl`) = ln 1e5 = 11.5. Steps with loss exactly 0 carry no information."""
    if not c.need("loss_blowup", "loss"):
        return
    n0, med, top = _loss_blocks(c, 2)
    if c.offset == 0 and c.n >= c.th.loss_window and n0[c.th.loss_window - 1] < 5:
        c.diag.not_assessable["loss_blowup"] = f"fewer than 5 non-zero losses in the first {c.th.loss_window} steps"
        return
    limit = np.fmax(top, c.th.loss_blowup_factor * med)
    # The exceedance rate a healthy trend may give: the reference block's own share above limit / g, g the
    # growth a healthy scale may make from the reference block's centre to this row at half an order of
    # magnitude per 100 steps (what that scale would put above the limit), distribution-free.
    grown = np.sqrt(c.th.loss_blowup_factor) ** (_loss_lag(c, 2) / 100)
    half = _loss_share_above(c, 2, limit / grown)
    p0 = np.minimum((half + 1) / (n0 + 1), 0.45)
    p1 = np.maximum(c.th.loss_blowup_share, 2 * p0)
    a = np.abs(c.s["loss"])
    # A reference block whose median is below the floor holds no scale (steps without signal): nothing to test.
    informative = (c.row >= c.th.loss_window) & (n0 >= 5) & (med >= c.th.loss_floor) & np.isfinite(a) & (a > 0)
    # The growth's shape (fourth pass): where the relative rate falls (_loss_rate_falls: a linear ramp from
    # a small base grows fastest at its start), the scale reached is growth already made, and an update
    # counts only if it is past the last block's maximum too (by exchangeability ~1/(n+1) of updates if
    # the growth has stopped). A blow-up's rate holds or rises (exponential, or flat then growing): the
    # test is unchanged there, and a blow-up that starts inside the last block (its maximum already
    # grown) is not delayed by it.
    _, _, top1 = _loss_blocks(c, 1)
    over = (a > limit) & ~(_loss_rate_falls(c) & (a <= top1))
    inc = np.where(informative, np.where(over, np.log(p1 / p0), np.log((1 - p1) / (1 - p0))), 0.0)
    s = c.cusum("loss_blowup", inc)
    h = math.log(c.th.loss_blowup_arl)

    def evidence(i, j):
        k = max(0, i - c.w)
        over = int(np.sum(a[k:j + 1] > limit[k:j + 1]))
        return (f"|loss| above {limit[i]:.3g} (the larger of {c.th.loss_blowup_factor:g}x the median {med[i]:.3g} and the "
                f"maximum {top[i]:.3g} of the {c.th.loss_window}-step block two before) at {over} of the updates in steps "
                f"{int(c.steps[k])}-{int(c.steps[j])}, up to {np.nanmax(a[i:j + 1]):.3g}; sequential test "
                f"{np.nanmax(s[i:j + 1]):.1f} >= {h:.1f}")

    c.fire("loss_blowup", s >= h, evidence, gap=c.w)


def _eval_table(c: _Ctx) -> dict[str, np.ndarray]:
    """Evaluation points carried in the state (the last acc_lookback + 2), then those of the judged
    rows: step, held-out accuracy, the reward's 2w moving mean and its noise at that step, the row
    (-1 for carried points and the step-0 baseline)."""
    acc = c.s["sample_acc"]
    rows = np.flatnonzero(np.isfinite(acc) & (np.arange(c.n) >= c.start))
    r_ma = c.ma("reward", 2 * c.w)
    r_noise = c.sd("reward", 2 * c.w) / math.sqrt(2 * c.w)
    new = {"step": c.steps[rows], "acc": acc[rows], "r_ma": r_ma[rows], "r_noise": r_noise[rows], "row": rows.astype(float)}
    old = c.state.get("evals")
    if old is None:
        old = {k: np.zeros(0) for k in new}
        if c.log.baseline_acc is not None and (not len(rows) or c.steps[rows[0]] > 0):  # the step-0 evaluation
            old = {"step": np.array([0.0]), "acc": np.array([c.log.baseline_acc]), "r_ma": np.array([np.nan]),
                   "r_noise": np.array([np.nan]), "row": np.array([-1.0])}
    table = {k: np.concatenate([old[k], new[k]]) for k in new}
    keep = c.th.acc_lookback + 2
    c.state["evals"] = {k: v[-keep:] if k != "row" else np.full(min(keep, len(v)), -1.0) for k, v in table.items()}
    table["new"] = np.arange(len(table["step"])) >= len(old["step"])
    return table


def _accuracy_declines(c: _Ctx, ev: dict[str, np.ndarray]) -> list[tuple[int, int, float, float, int, float]]:
    """Eval points where held-out accuracy fell below its peak beyond sampling noise.

    Accuracy is smoothed over two consecutive eval points (b_k), and b_k must sit z s below the peak
    of b over the last `acc_lookback` (L = 10) points, s = sqrt(p(1-p)/n) the binomial standard error
    of one evaluation of n = eval_n problems: the difference of two 2-point means that share no
    evaluation has standard error s. z comes from a false-alarm rate a step, not from results:
    `acc_decline_rate` = 1e-5 (one false decline in 100,000 steps, loss_blowup's rate). A test is
    made at every evaluation, g steps apart, against L candidate peaks: by Bonferroni each of the L
    comparisons may err with probability rate x g / L, so z = Phi^-1(1 - rate g / L): 4.1 for
    evaluations 20 steps apart, 4.3 for 10 (more, smaller tests a run: small, frequent evaluations
    need a larger drop, in their own noise s, which n sets). The earlier fixed 3.5 s had been raised
    from 3 on the fit families and paged 7 of 1,800 report-set runs (30 problems every 10 steps, and
    plateaus). Without n, the decline must reach `acc_unknown_n_floor`.
    Returns (peak_step, row, peak, value, n, reward moving mean at its peak since the accuracy peak)."""
    values = ev["acc"]
    if len(values) < 2:
        return []
    b = (values[1:] + values[:-1]) / 2
    n, lookback = c.log.eval_n, c.th.acc_lookback
    padded = np.concatenate([np.full(lookback, -np.inf), b])
    windows = np.lib.stride_tricks.sliding_window_view(padded[:-1], lookback)  # [k] = b[k-L .. k-1]
    peak = np.arange(len(b)) - lookback + windows.argmax(1)
    p = windows.max(1)
    if n:
        gap = np.maximum(np.diff(ev["step"]), 1.0)  # [k]: steps between the eval point of b[k] and the one before
        z = np.array([_NORMAL.inv_cdf(1 - min(c.th.acc_decline_rate * g / lookback, 0.5)) for g in gap])
        noise = np.maximum(z * np.sqrt(np.maximum(p * (1 - p), 1e-4) / n), c.th.acc_noise_floor)
    else:
        noise = np.full(len(b), c.th.acc_unknown_n_floor)
    hits = np.flatnonzero((p - b >= noise) & ev["new"][1:])
    # The reward's moving mean at the eval points from the accuracy peak on: its peak over that stretch.
    r = np.concatenate([np.full(lookback + 1, np.nan), ev["r_ma"]])
    r_windows = np.lib.stride_tricks.sliding_window_view(r, lookback + 2)  # [m] = r_ma[m-L-1 .. m]
    out = []
    for k in hits:
        m = k + 1  # the eval point of b[k]
        since = r_windows[m][lookback + 1 - (m - (peak[k] + 1)):]
        since = since[np.isfinite(since)]
        out.append((int(ev["step"][peak[k] + 1]), int(ev["row"][m]), p[k], b[k], n or 0,
                    float(since.max()) if len(since) else math.nan))
    return out


def late_degradation_and_reward_hacking(c: _Ctx) -> None:
    """Both read a held-out accuracy decline; the reward decides which: falling too -> degradation
    (instability), holding or rising -> hacking (the grader pays for something that is not the task).
    reward_hacking also pages on the training samples alone when the evidence there is strong (see
    correctness_drop): hacking shows on them before the held-out evaluation sees it."""
    have = c.need("late_degradation", "sample_acc", "reward") & c.need("reward_hacking", "sample_acc", "reward")
    if not have:
        if c.has("train_acc") and c.has("reward_aux"):
            c.diag.not_assessable.pop("reward_hacking", None)  # still judged on the training samples
        return
    ev = _eval_table(c)
    r_noise = c.sd("reward", 2 * c.w) / math.sqrt(2 * c.w)
    r_ma = c.ma("reward", 2 * c.w)
    for cid in ("late_degradation", "reward_hacking"):
        mask = np.zeros(c.n, dtype=bool)
        notes = {}
        for peak_step, r, p, v, n, reward_peak in _accuracy_declines(c, ev):
            # A fall is 5 % of the maximum, or a fifth of the reward's own level when that is low,
            # and always beyond the moving mean's noise.
            margin = max(min(c.th.reward_drop * c.log.max_reward, 0.2 * reward_peak), 2 * r_noise[r])
            fell = r_ma[r] < reward_peak - margin
            if fell == (cid == "late_degradation"):
                mask[r] = True
                notes[r] = (f"held-out accuracy (2-point mean) {100 * p:.1f} % at step {peak_step} -> {100 * v:.1f} % "
                            f"(n={n or 'unknown'}); reward (moving mean) {reward_peak:.3f} -> {r_ma[r]:.3f}")
        c.fire(cid, mask, lambda i, j, notes=notes: notes[max(k for k in notes if i <= k <= j)], gap=c.n)


def entropy_rows(c: _Ctx) -> None:
    """entropy_collapse, entropy_blowup, exploration and entropy_drift: the rows that read the entropy
    against its early baseline."""
    if not (c.need("entropy_collapse", "entropy", "reward") & c.need("entropy_blowup", "entropy", "reward")
            & c.need("entropy_drift", "entropy", "reward")):
        c.diag.not_assessable.setdefault("exploration", "the log has no entropy")
        return
    e, w = c.s["entropy"], c.w

    def stats(rows):
        head = e[rows]
        if not np.isfinite(head).any():
            return math.nan, math.nan
        mu = float(np.nanmedian(head))
        return mu, max(diff_noise(head) if np.isfinite(head).sum() >= 3 else 0.0, 0.01 * abs(mu), 1e-9)

    early = c.early("entropy_early", c.E, stats)
    if early is None:
        return
    baseline, noise = early
    c.diag.entropy_baseline = baseline
    ma, e_slope, r_slope = c.ma("entropy"), c.slope("entropy"), c.slope("reward")
    full = c.full(2 * w)
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
    signal = c.ma("frac_zero_std") < c.th.exploration_signal if c.has("frac_zero_std") else np.ones(c.n, dtype=bool)
    c.fire("exploration", full & (e_slope > 0) & (r_slope > 0) & (ma > c.th.exploration_rise * baseline) & signal,
           lambda i, j: f"entropy rising to {np.nanmax(ma[i:j + 1]):.3g} while reward rises: healthy exploration", gap=w)
    # entropy_drift: a CUSUM of the entropy's excess over its baseline, in units of its early
    # step-to-step noise, with an allowance of half the rise worth reporting (entropy_drift x the
    # baseline) and never below half a noise sd; reported once the moving mean has risen the whole
    # entropy_drift, and only while the reward is not rising: entropy rising with it is exploration.
    allowance = max(c.th.entropy_drift * abs(baseline) / 2, noise / 2)
    s = c.cusum("entropy_drift", np.where(c.row >= c.E, (e - baseline - allowance) / noise, 0.0))
    # Drift is the entropy still rising now (fourth pass): the baseline is the first 2 windows, and a run
    # whose entropy rose early and settled higher (zoo h3_entropy_rise_settle) stays above it for good; a
    # level reached and held is not a creep, and the CUSUM alone cannot tell (it never comes back down).
    # "Rising" is the 2w least-squares trend up beyond FORECAST_Z standard errors (_trend, as the forecast
    # reads a trend): a 2-SE difference of means passed by chance on 38 % of the settled runs.
    e_trend, _, e_se = _trend(e, 2 * w)
    alarm = ((s >= c.th.cusum_h) & ~_reward_rising(c) & (ma >= baseline * (1 + c.th.entropy_drift))
             & (e_trend > FORECAST_Z * e_se))
    # No held stage (see _escalate): entropy rising is not damage by itself, and the authors' stable 7_4
    # run ends with its entropy 5x its baseline, still rising (held, it paged at step 492). Its forecast
    # stage needs the damage's own sign: the reward turning down (its 2w trend falling beyond 3 SE, on a
    # line that loses `reward_drop` of the maximum within the horizon, and its 2w mean below the one 2w
    # earlier beyond the noise of that difference, the mirror of _reward_rising) while the entropy
    # creeps. The trend alone crossed 3 SE on 3 of 7_4's 500 steps (a real reward is not white noise).
    r = c.s["reward"]
    falling, eta = _forecast(c, r, c.ma("reward", 2 * w) - c.th.reward_drop * c.log.max_reward, -1.0)
    falling &= _reward_rising(c, -1.0)
    _escalate(c, "entropy_drift", alarm, None, 1.0,
              lambda i, j: f"entropy (moving mean) {np.nanmax(ma[i:j + 1]):.3g} vs an early baseline of {baseline:.3g} "
                           f"(noise {noise:.2g} a step); sequential test {np.nanmax(s[i:j + 1]):.0f} >= {c.th.cusum_h:g} "
                           "while the reward is not rising", gap=w,
              forecast=(falling, lambda i, j: f"the reward's trend over the last {2 * w} steps is down beyond its noise "
                                              f"and loses {c.th.reward_drop:g} of its maximum within {eta[i]:.0f} steps"))


# The warning rows with a critical stage; Row.stages says so to whoever exports a condition's severity.
ESCALATING = ("kl_acceleration", "length_drift", "correctness_drop")  # the warning rows with a held stage (_escalate)
# The warning rows with a forecast stage (_forecast): a critical as soon as the warning's signal, at its
# present trend less one standard error, reaches the row's failure level within `forecast_windows` windows.
FORECASTING = ("kl_acceleration", "length_drift", "correctness_drop", "entropy_drift")


def _escalate(c: _Ctx, cid: str, alarm: np.ndarray, raw: np.ndarray | None, sign: float, evidence, gap: int,
              excused: np.ndarray | None = None, forecast: tuple[np.ndarray, object] | None = None) -> None:
    """A drift row's warning, and its critical stages. A slow pathology (KL accelerating, lengths
    creeping to the cap, correctness falling under a format reward) does not correct itself: it runs
    on to the damage, and the critical page must come before that, not from the row the damage
    itself trips (issue 22). Two critical stages, each its own rule (label `stage`):

    - forecast (`forecast` = (mask, words), from _trend/_forecast): the warning, and the signal at its
      present trend reaching the row's failure level within the horizon. It comes with the warning
      when the trend is already clear, so it is the stage that leads (the third pass of docs/lead-time.md, in git history).
    - escalated (`raw` given): the warning held, with its signal (the w moving mean of `raw`;
      `sign` = +1 where higher is worse) worse than a window earlier by two standard errors of that
      difference (2 sqrt 2 se, se from the step-to-step noise, as kl_acceleration's), on every step
      of the last `escalate_windows` (m = 1) windows. Why the margin: without it "worse" is a coin
      flip on a flat series, and a chance warning held a window became critical (1 of 20 runs of a
      flat correctness series). Why m = 1: the shortest span any row judges. "Held" as Prometheus's
      `for:` holds: true at every step, m w + 1 steps from the first to the last (the rule pages on
      the same expression). It catches what the forecast's linear trend underrates.

    Either stage only promotes the warning: a healthy run's critical rate is at most its warning rate.
    The warning keeps the steps before (its lead is unchanged). `excused`: rows where the row's own
    premise says the drift does no damage, for the held stage (lengths creeping while the reward still
    rises, as length_capped); the forecast's mask carries its own."""
    assert cid in ESCALATING or cid in FORECASTING, cid
    m, w = c.th.escalate_windows, c.w
    ok = np.ones(c.n, dtype=bool) if excused is None else ~excused
    critical = np.zeros(c.n, dtype=bool)
    if raw is not None:
        ma, margin = moving_average(raw, w), 2 * math.sqrt(2) * _diff_se(raw, w)
        worse = ok.copy()
        for i in range(m):
            worse &= sign * (_shift(ma, i * w) - _shift(ma, (i + 1) * w)) > _shift(margin, i * w)
        critical = c.run_length(f"{cid}_held", alarm & worse) > m * w
    foreseen = np.zeros(c.n, dtype=bool)
    if forecast is not None:
        mask, words = forecast
        foreseen = alarm & mask
    c.fire(cid, alarm & ~critical & ~foreseen, evidence, severity="warning", gap=gap)
    if forecast is not None:
        c.fire(cid, foreseen, lambda i, j: f"{evidence(i, j)}; forecast: {words(i, j)}: critical",
               severity="critical", gap=gap)
    if raw is not None:
        c.fire(cid, critical, lambda i, j: f"{evidence(i, j)}; held {m * w} steps while getting worse: critical",
               severity="critical", gap=gap)


FORECAST_Z = 3.0  # a trend must stand this many standard errors out of its noise before it is extrapolated


def _trend(x: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The least-squares line over the trailing n rows, at every row: (slope per row, the line's value
    at the row, the slope's standard error), [N] each; NaN where the window is not complete and finite.
    As PromQL's predict_linear/deriv fit it. The error is the step-to-step noise sigma (the sd of the
    window's first differences / sqrt 2: a trend only shifts their mean, so a steep rise does not pass
    for noise, as _diff_se) over sqrt(Sxx), Sxx = n (n^2 - 1) / 12."""
    i = np.arange(len(x), dtype=float)
    full = moving_average(np.isfinite(x).astype(float), n) >= 1 - 1e-12
    mx, mix = moving_average(x, n), moving_average(i * x, n)
    slope = (mix - (i - (n - 1) / 2) * mx) / ((n * n - 1) / 12)
    end = mx + slope * (n - 1) / 2
    d = x - _shift(x, 1)
    sigma = windowed_sd(d, n) * np.sqrt(max(n - 1, 0) / n) / math.sqrt(2)
    se = sigma / math.sqrt(n * (n * n - 1) / 12)
    nan = np.where(full & (i >= n - 1), 1.0, np.nan)
    return slope * nan, end * nan, se * nan


def _forecast(c: _Ctx, x: np.ndarray, level, sign: float) -> tuple[np.ndarray, np.ndarray]:
    """Time to failure: where the trend of x over the last 2w rows (_trend) heads toward `level` (a
    number or [N]; `sign` +1: failure is x rising to it, -1: falling to it) beyond FORECAST_Z (3)
    standard errors, and the line, continued at its slope less one standard error, reaches it within
    H = `forecast_windows` x w rows. Returns (mask, rows to the crossing at that slope). A test of the
    trend over 2w rows is more powerful than a difference of two window means, and the horizon turns
    "getting worse" into "fails within H".

    Why less one standard error (tenth pass): the line is continued H = 5 x its own span ahead, so its
    value there carries ~H se of error from the slope alone. At the point slope, a chance steep window
    of a share that climbs and stops (report set 15: a logistic rise to 25 % cut) forecast 90 % cut:
    61 criticals on its 300 healthy runs. The crossing must survive the slope's own noise; on a
    noise-free line nothing changes (se = 0)."""
    slope, end, se = _trend(x, 2 * c.w)
    h = c.th.forecast_windows * c.w
    gap = sign * (level - end)  # how far the line still is from the level (<= 0: there already)
    towards = sign * slope > FORECAST_Z * se
    eta = np.where(towards, np.maximum(gap, 0) / np.where(towards, sign * slope - se, 1.0), np.inf)
    return towards & (eta <= h), eta


def _reward_rising(c: _Ctx, sign: float = 1.0) -> np.ndarray:
    """The reward's 2w moving mean above (sign -1: below) its value 2w steps earlier by more than twice
    the noise of that difference (each mean has SE sd / sqrt(2w))."""
    if not c.has("reward"):
        return np.zeros(c.n, dtype=bool)
    w2 = 2 * c.w
    ma = c.ma("reward", w2)
    se = c.sd("reward", w2) / math.sqrt(w2)
    return sign * (ma - _shift(ma, w2)) > 2 * math.sqrt(2) * se


def kl_rows(c: _Ctx) -> None:
    """kl_offset, kl_runaway, plateau_kl_flat, kl_dominant and kl_acceleration: the rows that read the KL."""
    c.need("kl_offset", "kl")
    for cid, other in (("kl_runaway", "reward"), ("kl_dominant", "frac_zero_std"), ("plateau_kl_flat", "reward")):
        c.need(cid, "kl", other)  # each row records what it lacks
    if not c.need("kl_acceleration", "kl"):
        return
    k_ma, k_slope = c.ma("kl"), c.slope("kl")
    full = c.full(2 * c.w)
    # The run's own early KL: a run that starts from an SFT model, measured against the base model it
    # was tuned from, has KL ~ 1 from its first step; over its bound but not a runaway (issue 22).
    k0 = c.early("kl_early", c.E, lambda rows: float(np.nanmedian(np.abs(c.s["kl"][rows]))))
    grown = k_ma > c.th.kl_growth * k0 if k0 is not None else np.zeros(c.n, dtype=bool)
    over = full & (k_ma > c.th.kl_bound)
    c.fire("kl_offset", over & ~grown & (k0 is not None),
           lambda i, j: f"KL {np.nanmax(k_ma[i:j + 1]):.3g} per token, over its bound {c.th.kl_bound:g} but not "
                        f"{c.th.kl_growth:g}x its early level {k0:.3g}: an offset from the reference, not growing", gap=c.w)
    if c.has("reward"):
        r_slope = c.slope("reward")
        c.fire("kl_runaway", over & grown & (r_slope < 0),
               lambda i, j: f"KL {np.nanmax(k_ma[i:j + 1]):.3g} per token (bound {c.th.kl_bound:g}; {c.th.kl_growth:g}x its "
                            f"early {k0:.3g} and more) while reward falls", gap=c.w)
        early = c.row < 5 * c.w  # "early in the run": its first five windows
        k_abs = np.abs(k_ma) if c.log.kl_signed else k_ma
        c.fire("plateau_kl_flat", full & early & (k_abs < c.th.kl_flat) & _reward_flat(c),
               lambda i, j: f"KL {np.nanmax(k_ma[i:j + 1]):.2g} (~0) and reward flat early in the run", gap=c.w)
    if c.has("frac_zero_std"):
        z = c.ma("frac_zero_std")
        k_before = _shift(k_ma, 2 * c.w)
        # KL at least doubling within two windows while no group carries signal: the KL term is
        # the only gradient left. A small, slowly growing KL on a saturated task is not this.
        c.fire(
            "kl_dominant",
            full & (z >= c.th.kl_dominant_zero) & (k_slope > 0) & (k_ma > c.th.kl_dominant_min) & (k_ma > 2 * k_before),
            lambda i, j: (
                f"KL rising to {np.nanmax(k_ma[i : j + 1]):.3g} while "
                f"{100 * np.nanmin(z[i : j + 1]):.0f} % of groups carry no signal"
            ),
            gap=c.w,
        )
    # kl_acceleration: super-linear growth. Consecutive window means m3, m2, m1, m0 (each with standard
    # error se): the KL was already growing (m1 - m2 > 4 sd of that difference, sqrt 2 se), and its
    # growth over the last window exceeds kl_accel (a = 1.25) times the window before's by 4 sd of
    # m0 - (1 + a) m1 + a m2 (sqrt(1 + (1 + a)^2 + a^2) se): a one-sided 4-sigma test, one false alarm
    # in ~30,000 steps of noise. Linear growth gives a ratio of 1, quadratic (2t - w) / (2t - 3w) (over
    # 1.25 until t = 5.5 w), an exponential doubling every T steps 2^(w / T) for as long as it lasts. And
    # the growth held a fourth window (m2 > m3; sixth pass): a KL swinging with a cyclic learning rate
    # is as convex as an exponential for a window or two out of each trough. With that guard `kl_accel`
    # came down from 2 (an exponential doubling within a window, which a slow one passed only after the
    # damage) to 1.25 (docs/lead-time.md in git history, sixth pass: fitted on the seen sets). The fourth window's rise
    # (d0 = m2 - m3) must clear 2 sd of that difference (2 sqrt 2 se), and the growth must already have
    # sped up the window before (d1 - d0 by 2 of its sd, 2 sqrt 6 se; HELD_Z; seventh pass): the growth
    # speeds up two windows in a row. A KL whose slope steps up (a warm-up ending, a schedule change) shows
    # a ratio of 2 or more for the window past the step, but the windows before it rose at one slope or
    # not at all: with a coin-flip m2 > m3, half of such runs warned. An exponential's d0 = d1 / r and
    # d1 - d0 = d1 (r - 1) / r clear both by the time the ratio test passes unless it doubles within a
    # window (docs/lead-time.md in git history, seventh pass: 0 to 4 steps of lead). se comes from the
    # step-to-step noise (a trend is not noise: with the window's raw sd a steep rise would hide
    # itself), computed as the rule computes it.
    w, a = c.w, c.th.kl_accel
    d1, d2 = _shift(k_ma, w) - _shift(k_ma, 2 * w), k_ma - _shift(k_ma, w)
    se = _diff_se(c.s["kl"], w)
    z1, z2 = KL_ACCEL_Z * math.sqrt(2), KL_ACCEL_Z * math.sqrt(1 + (1 + a) ** 2 + a * a)
    d0 = _shift(k_ma, 2 * w) - _shift(k_ma, 3 * w)
    held4 = d0 > HELD_Z * math.sqrt(2) * se
    sped = d1 - d0 > HELD_Z * math.sqrt(6) * se  # sd of m1 - 2 m2 + m3: sqrt 6 se
    accel = ((c.row >= 4 * w) & (k_ma >= c.th.kl_accel_min) & (d1 > z1 * se) & (d2 - a * d1 > z2 * se) & held4 & sped
             & (w >= MIN_STEPS))
    # Forecast: the growth is super-linear (the test above), so a straight line would underrate it; at
    # its own rate r a window, the KL is m0 r^(H/w) at the horizon H: critical when that is past kl_bound
    # (kl_runaway's level). PromQL says the same with `^`. r is the smaller of the last two windows'
    # ratios (m0 / m1, m1 / m2), not the last alone (fifth pass): an exponential's ratio holds window
    # after window, and ten windows of a ratio one window showed page on a turn. A KL swinging with a
    # cyclic learning rate (zoo h5_kl_cosine) doubles within the window out of each trough, then turns:
    # with the last ratio alone it paged critical on 67 of 300 healthy runs. And projected only as many
    # windows ahead as the window means have risen in a row, counted back from now, up to H (sixth pass): a
    # trend is extrapolated no further than it has been seen, and a swing or a hump that fell before
    # has little to show. PromQL: grpo:kl_mean:rising_windows.
    horizon = c.th.forecast_windows
    ratio = np.minimum(k_ma / _shift(k_ma, w), _shift(k_ma, w) / _shift(k_ma, 2 * w))
    rising, held = np.ones(c.n, dtype=bool), np.zeros(c.n)
    for i in range(KL_RISING_WINDOWS):
        rising &= _shift(k_ma, i * w) > _shift(k_ma, (i + 1) * w)  # NaN (before the run had the window): False
        held += rising
    held = np.minimum(held, horizon)
    projected = k_ma * np.where(ratio > 1, ratio, 1.0) ** held
    _escalate(c, "kl_acceleration", accel, c.s["kl"], 1.0,
              lambda i, j: f"KL (window mean) {np.nanmax(k_ma[i:j + 1]):.3g}: it grew {np.nanmax(d2[i:j + 1]):.3g} over the "
                           f"last {w} steps vs {d1[j]:.3g} over the {w} before (growth at least {a:g}x, beyond its noise)",
              gap=w,
              forecast=(projected > c.th.kl_bound,
                        lambda i, j: f"growing {ratio[i]:.2g}x a window for {held[i]:.0f} windows, it passes kl_bound "
                                     f"{c.th.kl_bound:g} within as many again ({held[i] * w:.0f} steps)"))


def _diff_se(x: np.ndarray, w: int) -> np.ndarray:
    """Standard error of a trailing w-step mean, from the step-to-step noise: sigma = the (population)
    sd of the window's first differences / sqrt 2 (a linear trend only shifts the differences' mean,
    so a steep rise does not pass for noise), se = sigma / sqrt w. The rule computes the same from
    the scrapes: stddev_over_time(idelta(...)[w:]) / sqrt 2 / sqrt(count_over_time) (grpo:kl_mean:se_w)."""
    d = x - _shift(x, 1)
    return windowed_sd(d, w) * np.sqrt(np.maximum(w - 1, 0) / w) / math.sqrt(2) / math.sqrt(w)


_NORMAL = NormalDist()
KL_ACCEL_Z = 4.0  # standard deviations of noise a KL acceleration must stand out of (one-sided p ~ 3e-5 a step)
HELD_Z = 2.0  # ... and the rise and speed-up of the windows before (as _escalate's "worse than a window earlier")
# A standard error estimated from fewer steps than this is itself noise: the rows that test against one
# need windows of at least MIN_STEPS steps (PromQL: a time window that holds fewer steps does not judge).
MIN_STEPS = 5
# A median's standard error per unit of the sample's interquartile range, times sqrt(n): 1.2533 sigma, sigma =
# IQR / 1.349, under normal noise.
MEDIAN_SE_PER_IQR = 1.2533 / 1.349
BINOMIAL_FLOOR = 0.01  # p(1-p) floor: a fraction near 0 or 1 still has the noise of a few completions


def length_pathology(c: _Ctx) -> None:
    if c.has("truncation_rate"):
        t = c.ma("truncation_rate")
        pinned = t >= c.th.truncation

        def what(i, j):
            return f"{100 * np.nanmax(t[i:j + 1]):.0f} % of completions truncated at max_new_tokens"

    elif c.log.max_new_tokens and c.has("response_len"):
        t = c.ma("response_len") / c.log.max_new_tokens
        pinned = t >= 0.9

        def what(i, j):
            return f"mean length {100 * np.nanmax(t[i:j + 1]):.0f} % of max_new_tokens={c.log.max_new_tokens}"

    else:
        c.diag.not_assessable["length_pathology"] = "the log has no truncation rate and max_new_tokens is unknown"
        return
    mask = c.full(c.w) & pinned
    if c.has("response_len_wrong") and c.has("response_len_correct"):
        ratio = c.ma("response_len_wrong") / c.ma("response_len_correct")
        mask |= c.full(c.w) & (ratio > c.th.wrong_longer) & (c.slope("response_len_wrong") > 0)
    c.fire("length_pathology", mask, what, gap=c.w)


def length_drift(c: _Ctx) -> None:
    """Completion length drifting up toward the cap, with the share of capped completions heading to half.

    u = mean length / cap. A CUSUM of u's excess over its early level, in units of its early noise
    (at least 1 % of the cap), with an allowance of half the drift worth a warning
    (`length_drift` of the way from the early level to the cap). The capped share (the truncation
    rate, or without one the steps whose mean length is the cap: every completion cut) must sit
    above its early level by more than two binomial standard errors of a window mean, and its trend
    reach `truncation` (half cut) within the horizon on every step of a window (or the share be there),
    unless the forecast critical, which needs no hold, fires first."""
    cap = c.log.max_new_tokens
    if not (cap and c.has("response_len")):
        c.diag.not_assessable["length_drift"] = (
            "max_new_tokens is unknown (not in the log, and lengths do not pile up at one ceiling)"
            if c.has("response_len")
            else "the log has no completion length"
        )
        return
    u = c.s["response_len"] / cap
    capped = c.s["truncation_rate"] if c.has("truncation_rate") else (c.s["response_len"] >= cap).astype(float)

    def stats(rows):
        head, t = u[rows], capped[rows]
        u0 = float(np.nanmedian(head))
        return u0, max(diff_noise(head) if np.isfinite(head).sum() >= 3 else 0.0, 0.01), float(np.nanmean(t))

    early = c.early("length_early", c.E, stats)
    if early is None:
        return
    u0, noise, t0 = early
    allowance = max(c.th.length_drift * (1 - u0) / 2, noise / 2)
    s = c.cusum("length_drift", np.where(c.row >= c.E, (u - u0 - allowance) / noise, 0.0))
    t_ma = moving_average(capped, c.w)
    q = min(max(t0, 1 / c.w), 0.5)
    share_up = t_ma > t0 + 2 * math.sqrt(q * (1 - q) / c.w)
    u_ma = moving_average(u, c.w)
    # Forecast: the capped share's trend reaching `truncation_capped` (length_capped's level: almost no
    # completion ends, so no group is graded and the gradient goes) within the horizon. Not excused by a
    # rising reward while few are cut (the uncut ones still learn; the premise is about the cut ones): only
    # a reward rising with `truncation` (half) or more cut refutes it, as on a run that grades cut answers.
    rising = _reward_rising(c)
    capping, eta = _forecast(c, capped, c.th.truncation_capped, 1.0)
    capping &= ~(rising & (t_ma >= c.th.truncation))
    # Warning (ninth pass): as the critical forecasts length_capped's level, the warning forecasts
    # length_pathology's, `truncation` (half the completions cut), held a window (as a `for:`), or the share is
    # there. Lengths that grow with a bounded share cut are a run learning to reason longer (report set 14:
    # 10-20 % cut, then holding); a share above its early level alone warned on 78 % of those runs, and a
    # forecast of the nearer level, unheld, is reached by a chance steep trend on single steps. A forecast
    # critical needs no hold: it promotes its own warning, and it is unchanged.
    drifting = (s >= c.th.cusum_h) & share_up
    halfway, eta_half = _forecast(c, capped, c.th.truncation, 1.0)
    held = c.run_length("length_drift_halfway", drifting & (halfway | (t_ma >= c.th.truncation))) > c.w
    alarm = drifting & (held | capping)

    def evidence(i, j):
        share, soonest = np.nanmax(t_ma[i:j + 1]), float(np.min(eta_half[i:j + 1]))
        heading = f"; at its trend half are cut within {soonest:.0f} steps" if 0 < soonest < math.inf else ""
        return (f"mean length (moving mean) {100 * np.nanmax(u_ma[i:j + 1]):.0f} % of the cap {cap} (early {100 * u0:.0f} "
                f"%); capped share {100 * share:.0f} % (early {100 * t0:.0f} %){heading}")

    # Held: the capped share, not the length, getting worse a window on (eighth pass). Lengths keep rising on
    # a run learning to reason longer (report set 13: to 63 % of the cap, 16 % cut, held rising for 20 steps);
    # what heads to the damage is the share of completions cut, which must be climbing beyond its noise.
    _escalate(c, "length_drift", alarm, capped, 1.0, evidence, gap=c.w, excused=rising,
              forecast=(capping, lambda i, j: f"at its trend over the last {2 * c.w} steps the capped share reaches "
                                              f"{100 * c.th.truncation_capped:.0f} % within {eta[i]:.0f} steps"))


def correctness_drop_and_training_reward_hacking(c: _Ctx) -> None:
    """correctness_drop (warning, escalating) and the training-side half of reward_hacking (critical).

    The verifier's acceptance on the training samples (train_acc, or a correctness reward
    component) against the running peak of its 2w moving mean. Noise: the early step-to-step sd,
    which for a fraction of B completions is its binomial noise sqrt(p(1-p)/B), measured (it also
    holds the correlation within groups that the formula misses; B need not be known). A CUSUM of
    the shortfall below the recent peak, allowance half of `correctness_drop` (10 %) of the peak (at
    least half a noise sd) plus the peak's own upward bias, alarms at `cusum_h`: a warning, whatever the
    cause (the policy getting worse at the task shows here before the sparse held-out evaluation
    sees it). Critical (reward_hacking) when an auxiliary reward (format, length, style:
    `reward_aux`) holds or rises meanwhile and the fall is realised: the moving mean
    `correctness_drop` below the peak and three of its standard errors more."""
    if not c.need("correctness_drop", "train_acc"):
        return
    acc, w2 = c.s["train_acc"], 2 * c.w

    def stats(rows):
        head = acc[rows]
        sigma = max(diff_noise(head) if np.isfinite(head).sum() >= 3 else 0.0, 1e-3)
        p0 = float(np.nanmean(head))
        return max(p0 * (1 - p0), BINOMIAL_FLOOR) / sigma**2  # B_eff: completions a step, as the noise says

    b_eff = c.early("correctness_early", c.E, stats)
    if b_eff is None:
        return
    ma = c.ma("train_acc", w2)
    # The peak over the last `correctness_lookback` (10) 2w-windows: the max of ever more windows of a
    # noisy mean drifts up without bound (after 100,000 steps it sits ~4 standard errors above the true
    # level, and a flat healthy run would page); over ~10 independent windows it sits ~1.5 above, and
    # two standard errors are added to the allowance for it.
    peak = c.trailing_max("correctness_peak", np.where(c.row >= c.E, ma, np.nan), c.th.correctness_lookback * w2)
    # The noise of a fraction moves with its level (binomial: sqrt(p(1-p)/B)): at the peak's level,
    # with the B the early noise implies. A run that learns from 0.2 to 0.5 has 25 % more noise than
    # it had early, and judged against the early sd would drift to an alarm.
    noise = np.sqrt(np.maximum(peak * (1 - peak), BINOMIAL_FLOOR) / b_eff)
    allowance = np.maximum(c.th.correctness_drop * peak / 2, noise / 2) + 2 * noise / math.sqrt(w2)
    s = c.cusum("correctness_drop", np.where((c.row >= c.E) & np.isfinite(peak), (peak - acc - allowance) / noise, 0.0))
    alarm = (s >= c.th.cusum_h) & (ma < peak)
    has_aux = c.has("reward_aux")
    if has_aux:
        aux_ma = c.ma("reward_aux", w2)
        aux_se = c.sd("reward_aux", w2) / math.sqrt(w2)
        holds = aux_ma >= _shift(aux_ma, w2) - 2 * math.sqrt(2) * aux_se  # not falling beyond its noise
    else:
        aux_ma, holds = np.full(c.n, np.nan), np.zeros(c.n, dtype=bool)

    def evidence(i, j):
        k = i + int(np.nanargmin(ma[i:j + 1]))
        text = (f"training correctness (2w moving mean) {100 * peak[k]:.1f} % at its recent peak -> {100 * ma[k]:.1f} % "
                f"(noise {100 * noise[k]:.1f} points a step; sequential test {np.nanmax(s[i:j + 1]):.0f} >= {c.th.cusum_h:g})")
        if has_aux:
            text += (f" while the auxiliary reward holds at {aux_ma[k]:.3g}" if holds[k] else
                     f"; the auxiliary reward fell too ({aux_ma[k]:.3g})")
        return text

    # Forecast: the correctness's trend reaching the realised fall (`correctness_drop` below the peak, the
    # damage's own definition) within the horizon, while an auxiliary reward holds (format hacking's
    # premise: the combined reward does not show it). Without an auxiliary reward the trend is not
    # extrapolated: a chance dip on a flat correctness trips the CUSUM and a 3-SE trend together (they
    # read the same noise), and paged 1 of 300 runs flat for 150 steps (zoo `report_plateau_150`).
    falling, eta = _forecast(c, acc, (1 - c.th.correctness_drop) * peak, -1.0)
    falling &= holds
    _escalate(c, "correctness_drop", alarm, acc, -1.0, evidence, gap=c.w,
              forecast=(falling, lambda i, j: f"at its trend over the last {w2} steps the training correctness falls "
                                              f"{100 * c.th.correctness_drop:.0f} % below its peak within {eta[i]:.0f} steps"))
    realised = ma <= (1 - c.th.correctness_drop) * peak - 3 * noise / math.sqrt(w2)
    c.fire("reward_hacking", alarm & realised & holds, lambda i, j: "on the training samples: " + evidence(i, j), gap=c.n)


def all_wrong_rising(c: _Ctx) -> None:
    """The share of all-wrong groups rising above its early level: a CUSUM in units of its early
    step-to-step noise (the binomial noise of P groups a step, measured), allowance half of
    `all_wrong_rise` (0.2). Groups that are all wrong teach nothing, and their share rises before
    accuracy falls."""
    if not c.need("all_wrong_rising", "frac_zero_std_wrong"):
        return
    q = c.s["frac_zero_std_wrong"]

    def stats(rows):
        head = q[rows]
        return float(np.nanmean(head)), max(diff_noise(head) if np.isfinite(head).sum() >= 3 else 0.0, 1e-3)

    early = c.early("all_wrong_early", c.E, stats)
    if early is None:
        return
    q0, noise = early
    allowance = max(c.th.all_wrong_rise / 2, noise / 2)
    s = c.cusum("all_wrong_rising", np.where(c.row >= c.E, (q - q0 - allowance) / noise, 0.0))
    q_ma = c.ma("frac_zero_std_wrong")
    c.fire("all_wrong_rising", (s >= c.th.cusum_h) & (q_ma > q0 + allowance),
           lambda i, j: f"all-wrong groups (moving mean) {100 * np.nanmax(q_ma[i:j + 1]):.0f} % vs {100 * q0:.0f} % early "
                        f"(sequential test {np.nanmax(s[i:j + 1]):.0f} >= {c.th.cusum_h:g})", gap=c.w)


def _reward_flat(c: _Ctx) -> np.ndarray:
    """Reward change over the last 2 windows below `reward_drop` of the maximum (a least-squares-like
    difference of moving means, so a reward quantised to 1/B still shows a trend)."""
    gain = (c.ma("reward") - c.ma("reward", 2 * c.w)) * 2
    return np.abs(gain) < c.th.reward_drop * c.log.max_reward


def small_group_loose_grader_kl_only_learning(c: _Ctx) -> None:
    """plateau_small_group, plateau_grader_loose and kl_only_learning: the plateau rows that are not
    plateau_kl_flat (kl_rows) or no_progress."""
    full = c.full(2 * c.w)
    if c.need("plateau_small_group", "reward", "frac_zero_std"):
        if c.log.group_size is None:
            c.diag.not_assessable["plateau_small_group"] = "the group size G is unknown"
        elif c.log.group_size <= c.th.small_group:
            z = c.ma("frac_zero_std")
            c.fire(
                "plateau_small_group",
                full & _reward_flat(c) & (z >= c.th.small_group_zero),
                lambda i, j: (
                    f"G = {c.log.group_size}: reward flat, {100 * np.nanmax(z[i : j + 1]):.0f} % of groups without signal"
                ),
                gap=c.w,
            )
    if c.need("plateau_grader_loose", "reward", "train_acc"):
        # What the grader pays vs what the strict verifier accepts *on the same completions*. (Reward vs
        # held-out accuracy would also fire on any train/eval difficulty gap, e.g. both book runs.)
        r = c.ma("reward", 2 * c.w) / c.log.max_reward
        strict = c.ma("train_acc", 2 * c.w)
        kl_ok = c.ma("kl") >= c.th.kl_flat if c.has("kl") else np.ones(c.n, dtype=bool)
        c.fire("plateau_grader_loose", full & _reward_flat(c) & kl_ok & (r >= c.th.loose_reward) &
               (r - strict >= c.th.loose_gap),
               lambda i, j: f"reward {np.nanmax(r[i:j + 1]):.2f} of its maximum and flat, while the verifier accepts "
                            f"{100 * strict[j]:.0f} % of the same completions", gap=c.w)
    if c.need("kl_only_learning", "loss", "reward"):
        lo = c.ma("loss", 2 * c.w)
        before = _shift(lo, 2 * c.w)
        noise = c.sd("loss", 2 * c.w) / math.sqrt(2 * c.w)
        # The earlier level must itself stand out of the noise, and the fall be well beyond it: the
        # test runs at every step, so 3 sigma still paged 2 % of simulated healthy runs; 5 sigma none.
        falling = (before > 5 * noise) & (lo < 0.5 * before) & (before - lo > 5 * math.sqrt(2) * noise)
        hit = c.full(4 * c.w) & falling & _reward_flat(c) & (np.arange(c.n) >= c.start) & (c.w >= MIN_STEPS)
        # One spike inflates a window mean, and the window after it then "falls": the medians must
        # fall too, by half and beyond their own noise (fifth pass): a median's standard error is
        # 1.2533 sigma / sqrt(n) under normal noise, sigma from the earlier window's interquartile range
        # (IQR / 1.349: the spikes do not move it; PromQL has quantile_over_time, not a MAD), and the fall
        # must pass 5 sqrt 2 of them, as the means' does. Without that a median of
        # a loss whose KL term sits under its noise (0.001 under 0.002) halved by chance, after a spike had
        # inflated the mean before it: 17 of 300 runs of report set 5's contaminated loss warned.
        # Checked only where the means fall, so a long healthy log costs nothing.
        i = np.flatnonzero(hit)
        if i.size:
            windows = np.lib.stride_tricks.sliding_window_view(c.s["loss"], 2 * c.w)  # [k] = steps k .. k+2w-1
            now, then = windows[i - 2 * c.w + 1], windows[i - 4 * c.w + 1]  # [hits, 2w] each
            m_now, m_then = np.nanmedian(now, 1), np.nanmedian(then, 1)
            q25, q75 = np.nanquantile(then, [0.25, 0.75], axis=1)
            se = MEDIAN_SE_PER_IQR * (q75 - q25) / math.sqrt(2 * c.w)
            hit[i] = (m_now < 0.5 * m_then) & (m_then - m_now > 5 * math.sqrt(2) * se)
        c.fire("kl_only_learning", hit,
               lambda i, j: f"loss (moving mean) {np.nanmax(before[i:j + 1]):.3g} -> {np.nanmin(lo[i:j + 1]):.3g} "
                            "while reward is flat", gap=c.w)


def no_progress(c: _Ctx) -> None:
    """The reward is flat since the start, whatever the KL (a run can learn nothing with a KL that moves).

    Two tests, both needed. Never rose: the best w-mean since the start never stood `no_progress_z` (3)
    standard errors of a difference of two w-means above the first window's mean (noise: the early
    step-to-step sd); once it does, the condition ends for good. Flat: the rise the reward's least-squares
    line over every row so far implies is, even at its upper `no_progress_z`-SE bound, below `reward_drop`
    of the maximum. The first alone reads "not proven to rise" as "flat": a run whose per-step reward is
    noisy and whose first window is short (the demo: 7 steps of sd 0.13) learning modestly (+0.09) was
    paged at step 70; the second pages only a run whose data say the reward is flat. Judged once the run
    has `no_progress_windows` (10) windows: a policy often learns the output format first, with its
    correctness flat for a first stretch (tests/zoo.py `healthy_plateau_rise`; docs/explanation/lead-time.md says this
    was fitted on it). A reward at its maximum from the start is reward_saturated, not this."""
    if not c.need("no_progress", "reward"):
        return
    r, w = c.s["reward"], c.w
    rise, rise_se = _line_rise(c, r, "reward_line")  # every row's sums, the early ones included

    def stats(rows):
        head = r[rows]
        return float(np.nanmean(head[:w])), max(diff_noise(head) if np.isfinite(head).sum() >= 3 else 0.0, 1e-9)

    early = c.early("reward_early", c.E, stats)
    if early is None:
        return
    r0, noise = early
    ma = c.ma("reward")
    best = np.full(c.n, np.nan)
    if c.start < c.n:  # the running best w-mean, carried as one number
        seg = np.where((c.row >= w - 1) & np.isfinite(ma), ma, -np.inf)[c.start:]
        best[c.start:] = np.maximum.accumulate(np.concatenate([[c.state.get("reward_best", -np.inf)], seg]))[1:]
        c.state["reward_best"] = float(best[-1])
    margin = c.th.no_progress_z * math.sqrt(2) * noise / math.sqrt(w)
    flat = rise + c.th.no_progress_z * noise * rise_se < c.th.reward_drop * c.log.max_reward
    hit = (c.row >= c.th.no_progress_windows * w - 1) & (best - r0 < margin) & flat & (r0 < c.th.saturated * c.log.max_reward)
    c.fire("no_progress", hit & (w >= MIN_STEPS),
           lambda i, j: f"reward (moving mean) at best {best[j]:.3g} vs {r0:.3g} in its first window, never "
                        f"{c.th.no_progress_z:g} standard errors ({margin:.3g}) above it; its line over {int(c.row[j]) + 1} "
                        f"steps rises {rise[j]:+.3g} (at most {rise[j] + c.th.no_progress_z * noise * rise_se[j]:+.3g})",
           gap=c.w)


def _line_rise(c: _Ctx, x: np.ndarray, key: str) -> tuple[np.ndarray, np.ndarray]:
    """At each judged row i: the rise over rows 0..i of x's least-squares line (its slope times the span), and
    that rise's standard error per unit of per-step noise (span / sqrt(sum (t - mean t)^2)). The five sums
    of the fit are carried, so the monitor's tail judges the whole run. NaN where fewer than 3 rows."""
    rise, se = np.full(c.n, np.nan), np.full(c.n, np.nan)
    if c.start >= c.n:
        return rise, se
    t, v = c.row[c.start:].astype(float), x[c.start:]
    ok = np.isfinite(v)
    t, v = np.where(ok, t, 0.0), np.where(ok, v, 0.0)
    prior = c.state.get(key, np.zeros(5))
    sums = prior + np.cumsum(np.stack([ok.astype(float), t, t * t, v, t * v]), axis=1).T  # [rows, 5]
    c.state[key] = sums[-1].copy()
    n, st, stt, sv, stv = sums.T
    span = c.row[c.start:].astype(float)  # rows since the run's first
    with np.errstate(divide="ignore", invalid="ignore"):
        sxx = stt - st * st / n  # sum (t - mean t)^2
        slope = (stv - st * sv / n) / sxx
        rise[c.start:] = np.where(n >= 3, slope * span, np.nan)
        se[c.start:] = np.where(n >= 3, span / np.sqrt(sxx), np.nan)
    return rise, se


def zero_gradient(c: _Ctx) -> None:
    """A gradient norm of exactly 0 on every step of a window while groups still carry reward spread:
    nothing is being trained (parameters frozen or detached). When every group is all-same the zero
    gradient is the reward's doing: that is signal_vanished, at its extreme, not this row."""
    if not c.need("zero_gradient", "grad_norm"):
        return

    def run(x):
        return moving_average(x.astype(float), c.w) >= 1 - 1e-9  # every row of the trailing window

    g = c.s["grad_norm"]
    explained = run(c.s["frac_zero_std"] >= 1) if c.has("frac_zero_std") else np.zeros(c.n, dtype=bool)
    c.fire("zero_gradient", c.full(c.w) & run(np.isfinite(g) & (g == 0)) & ~explained,
           lambda i, j: f"gradient norm exactly 0 on every step of {c.w}-step windows while groups carry reward spread: "
                        "nothing is being trained", gap=c.w)


def grad_norm_spike(c: _Ctx) -> None:
    """The gradient norm above `grad_spike` (10) times the median of the previous `loss_window` (50)
    steps: the update that precedes a loss spike or a divergence (the median, not the mean: the
    norm is heavy-tailed, and one spike must not raise the bar for the next)."""
    if not c.need("grad_norm_spike", "grad_norm"):
        return
    g, lw = np.abs(c.s["grad_norm"]), c.th.loss_window
    med = np.full(c.n, np.nan)
    judged = np.flatnonzero((np.arange(c.n) >= max(c.start, lw)))
    if judged.size:
        windows = np.lib.stride_tricks.sliding_window_view(g, lw)  # [k] = rows k .. k+lw-1
        med[judged] = np.nanmedian(windows[judged - lw], axis=1)
    hit = (c.row >= lw) & (med >= c.th.grad_floor) & (g > c.th.grad_spike * med)  # norms of ~1e-6 set no scale
    c.fire("grad_norm_spike", hit,
           lambda i, j: f"gradient norm up to {np.nanmax(g[i:j + 1]):.3g}, over {c.th.grad_spike:g}x the median "
                        f"{np.nanmin(med[i:j + 1]):.3g} of the {lw} steps before", gap=c.w)


def clip_imbalance(c: _Ctx) -> None:
    """One side of the ratio clip binding far more than the other (TRL's clip_ratio/low_mean and
    high_mean): the upper clip binding keeps unlikely tokens with positive advantages from growing,
    the lever of entropy collapse that DAPO's clip-higher loosens; the lower one binding, updates that
    push likely tokens down hard."""
    if not c.need("clip_imbalance", "clip_low", "clip_high"):
        return
    lo, hi = c.ma("clip_low"), c.ma("clip_high")
    big, small = np.fmax(lo, hi), np.fmin(lo, hi)
    hit = c.full(c.w) & (big >= c.th.clip_imbalance_min) & (big >= c.th.clip_imbalance * np.maximum(small, 1e-6))
    c.fire("clip_imbalance", hit,
           lambda i, j: f"ratio clip active on {100 * np.nanmax(hi[i:j + 1]):.2g} % of tokens at the upper bound vs "
                        f"{100 * np.nanmax(lo[i:j + 1]):.2g} % at the lower ({c.w}-step means)", gap=c.w)


def length_capped(c: _Ctx) -> None:
    """Almost every completion cut at the cap (the truncation rate's window mean at
    `truncation_capped`, 0.9, from below `truncation` early in the run) while the reward is not rising:
    a cut answer is not graded, so groups lose their reward spread and the gradient heads to 0;
    critical, where length_pathology (half of them cut) is a warning. Or every completion cut and every
    reward 0 over a window, from whatever start."""
    if c.has("truncation_rate"):
        t = c.ma("truncation_rate")

        def what(i, j):
            return f"{100 * np.nanmax(t[i:j + 1]):.0f} % of completions cut at max_new_tokens ({c.w}-step mean)"

    elif c.log.max_new_tokens and c.has("response_len"):
        t = c.ma("response_len") / c.log.max_new_tokens

        def what(i, j):
            return f"mean length {100 * np.nanmax(t[i:j + 1]):.0f} % of max_new_tokens={c.log.max_new_tokens}"

    else:
        c.diag.not_assessable["length_capped"] = "the log has no truncation rate and max_new_tokens is unknown"
        return
    # Heading to 1: the rate came from below length_pathology's level early in the run (a run capped from
    # its first step is a setting, length_pathology's warning). And a run that still learns while capped
    # is grading its cut answers (a JSON that fits, a short final line): the row's premise fails there.
    # Capped from the start with every reward 0 is no setting to live with: no completion is ever graded, nothing
    # can be learned (a cold start whose answers never fit the cap), whatever the early level.
    unpaid = (c.ma("reward") == 0) & c.full(c.w) if c.has("reward") else np.zeros(c.n, dtype=bool)
    t0 = c.early("capped_early", c.E, lambda rows: float(np.nanmean(t[rows])))
    came = t0 is not None and t0 < c.th.truncation
    capped = c.full(c.w) & (t >= c.th.truncation_capped)
    c.fire("length_capped", capped & ((came & ~_reward_rising(c)) | (unpaid & (t >= 1 - 1e-9))), what, gap=c.w)


def train_inference_mismatch(c: _Ctx) -> None:
    """The sampler's log-probs drifting from the trainer's for the same tokens (a bf16 sampler for an fp32 trainer,
    other kernels, a stale or broken weight sync): the token-mean k3 between them (mismatch_kl), or, from a log
    that has only the mean |log-prob gap| (TRL's sampling/sampling_logp_difference/mean), half its square, a lower
    bound (k3 ~ d^2 / 2 per token for small gaps, and E d^2 >= (E |d|)^2).

    Warning: its w mean `mismatch_rise` (2) times the run's early level (the median of its first steps), beyond two
    standard errors of that level's window mean (the early step-to-step noise), and at least `mismatch_floor`.
    Critical: its w mean at `mismatch_critical` (0.1, where runs are reported collapsed); or one step
    `mismatch_jump` (10) times the median of the w steps before, or its w mean that many times the early level,
    either at least `mismatch_jump_floor` (1e-3): a sampler out of sync with the weights, or a drift an order of
    magnitude past where the run began. It grows before a collapse (Yao et al. 2025; Liu & Li 2025: the gradient
    norm blows up after it), so it pages before the damage the other rows read."""
    if c.has("mismatch_kl"):
        x, what = c.s["mismatch_kl"], "mismatch KL (token-mean k3, sampler vs trainer)"
    elif c.has("logp_diff_mean"):
        x, what = 0.5 * c.s["logp_diff_mean"] ** 2, "mismatch KL (at least, from the mean |log-prob gap|: d^2 / 2)"
    else:
        c.diag.not_assessable["train_inference_mismatch"] = "the log has no mismatch_kl or logp_diff_mean"
        return
    w, th = c.w, c.th

    def stats(rows):
        head = x[rows]
        level = float(np.nanmedian(head)) if np.isfinite(head).any() else math.nan
        return level, diff_noise(head) if np.isfinite(head).sum() >= 3 else 0.0

    early = c.early("mismatch_early", c.E, stats)
    ma = moving_average(x, w)
    before = np.full(c.n, np.nan)  # the median of the w steps before each judged row
    judged = np.flatnonzero(np.arange(c.n) >= max(c.start, w))
    if judged.size:
        before[judged] = np.nanmedian(np.lib.stride_tricks.sliding_window_view(x, w)[judged - w], axis=1)
    jump = (x >= th.mismatch_jump * before) & (x >= th.mismatch_jump_floor)
    level = c.full(w) & (ma >= th.mismatch_critical)
    rise = np.zeros(c.n, dtype=bool)
    if early is not None and np.isfinite(early[0]):
        m0, noise = early
        rise = (c.full(w) & (ma >= th.mismatch_rise * m0) & (ma - m0 > 2 * math.sqrt(2) * noise / math.sqrt(w))
                & (ma >= th.mismatch_floor))
    context = _mismatch_context(c.log)

    def evidence(i, j):
        k = i + int(np.nanargmax(np.where(np.isfinite(x[i:j + 1]), x[i:j + 1], -np.inf)))
        text = f"{what} {w}-step mean up to {np.nanmax(ma[i:j + 1]):.3g}"
        if early is not None and np.isfinite(early[0]):
            text += f" vs {early[0]:.3g} early in the run"
        if jump[i:j + 1].any():
            text += f"; step {int(c.steps[k])} at {x[k]:.3g}, {x[k] / max(before[k], 1e-300):.3g}x the {w} steps before"
        return text + (f" ({context})" if context else "")

    # An order of magnitude above the run's own level, held a window (the jump, sustained; or a slow rise that got there)
    sustained = np.zeros(c.n, dtype=bool)
    if early is not None and np.isfinite(early[0]):
        sustained = c.full(w) & (ma >= th.mismatch_jump * early[0]) & (ma >= th.mismatch_jump_floor)
    critical = level | jump | sustained
    c.fire("train_inference_mismatch", rise & ~critical, evidence, severity="warning", gap=w)
    c.fire("train_inference_mismatch", critical, evidence, severity="critical", gap=w)


def _mismatch_context(log) -> str:
    """What biases the mismatch: the precisions of sampler and trainer, temperature and top_p (a sampler's
    log-probs are renormalised over its nucleus where the trainer's are not: a gap by construction), and whether
    the ratio was logged raw or after a correction truncated or masked it."""
    sm, sp = log.sampler, log.sampling
    parts = []
    if sm.get("backend"):
        parts.append(f"sampler {sm['backend']}" + (f" in {sm['sampler_dtype']}" if sm.get("sampler_dtype") else "")
                     + (f", trainer in {sm['trainer_dtype']}" if sm.get("trainer_dtype") else ""))
    if sp:
        top_p = sp.get("top_p", 1.0)
        parts.append(f"temperature {sp.get('temperature', 1.0):g}, top_p {top_p:g}"
                     + (" (the sampler renormalises over its nucleus: a gap by construction)" if top_p < 1 else ""))
    if sm.get("ratio"):
        parts.append(f"importance ratio {sm['ratio']}")
    return "; ".join(parts)


def repetition(c: _Ctx) -> None:
    """Completions repeating themselves: the window mean of the step's seq-rep-4 (the trainer's
    `repetition`: per completion, the share of its word 4-grams that repeat an earlier one) at
    `repetition` (0.3) or more. Welleck et al. (2019) measure ~0.01 on human text and ~0.4 on the
    greedy loops of a likelihood-trained LM: 0.3 is far above any prose and below a loop. A level,
    as the rule reads it (grpo:repetition_rate:avg_w)."""
    if not c.need("repetition", "repetition"):
        return
    r = c.ma("repetition")
    c.fire("repetition", c.full(c.w) & (r >= c.th.repetition),
           lambda i, j: f"{100 * np.nanmax(r[i:j + 1]):.0f} % of the completions' word 4-grams repeat an earlier one "
                        f"({c.w}-step mean; threshold {100 * c.th.repetition:.0f} %)", gap=c.w)


DETECTORS = [adv_mean_drift, nonfinite, reward_saturated, signal_vanished, policy_collapse, loss_spike, loss_blowup,
             late_degradation_and_reward_hacking, correctness_drop_and_training_reward_hacking, entropy_rows, kl_rows,
             length_pathology, length_drift, all_wrong_rising, small_group_loose_grader_kl_only_learning, no_progress,
             zero_gradient, grad_norm_spike, clip_imbalance, length_capped, repetition, train_inference_mismatch]
