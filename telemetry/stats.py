"""The same ruler for latency and rewards: percentiles, summaries, sd, windowed curve shape, and a
completion's repetition (seq-rep-n).

Scalar helpers take any sequence and never mutate it; window helpers take numpy arrays and are
vectorised (cumulative sums), so a million-step log costs milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def percentile(xs: Sequence[float], p: float) -> float:
    """Linear interpolation: idx = p/100 * (n-1), between floor and ceil. Empty -> NaN."""
    s = sorted(xs)
    if not s:
        return math.nan
    idx = p / 100 * (len(s) - 1)
    lo, hi = math.floor(idx), math.ceil(idx)
    w = idx - lo
    return s[lo] * (1 - w) + s[hi] * w


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if len(xs) else math.nan


def sd(xs: Sequence[float]) -> float:
    """Sample standard deviation (n-1); fewer than 2 samples -> 0."""
    n = len(xs)
    if n < 2:
        return 0.0
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))


def summarize(xs: Sequence[float]) -> dict[str, float]:
    """{n, mean, p5, p50, p95, p99}: the tail that the mean hides. NaNs are ignored."""
    clean = [float(x) for x in xs if not math.isnan(x)]
    return {"n": len(clean), "mean": mean(clean), **{f"p{p}": percentile(clean, p) for p in (5, 50, 95, 99)}}


def _window_sums(x: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Trailing-window sums of the finite values and their counts; [N] each (window shorter at the start).
    Differences of one cumulative sum, by slicing (no fancy indexing: a million steps in ~10 ms)."""
    n, w = len(x), max(int(w), 1)
    ok = np.isfinite(x)
    c = np.zeros(n + 1)
    np.cumsum(np.where(ok, x, 0.0), out=c[1:])
    k = np.zeros(n + 1)
    np.cumsum(ok, out=k[1:])
    s, cnt = c[1:].copy(), k[1:].copy()
    if n > w:
        s[w:] -= c[1 : n - w + 1]
        cnt[w:] -= k[1 : n - w + 1]
    return s, cnt


def moving_average(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing mean over the last w points (NaNs skipped; NaN where the window has none)."""
    s, n = _window_sums(x, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, s / n, np.nan)


def windowed_sd(x: np.ndarray, w: int) -> np.ndarray:
    """Trailing sample sd (n-1) over the last w points; 0 where fewer than 2 values."""
    s, n = _window_sums(x, w)
    s2, _ = _window_sums(np.where(np.isfinite(x), x, np.nan) ** 2, w)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = (s2 - s * s / n) / (n - 1)
    return np.where(n >= 2, np.sqrt(np.clip(var, 0, None)), 0.0)


def slope(y: Sequence[float], x: Sequence[float] | None = None) -> float:
    """Least-squares slope of y on x (default 0..n-1). Fitted on raw values, not differences, so a
    reward quantised to 1/G still shows its trend. NaNs ignored; fewer than 2 points -> NaN."""
    y = np.asarray(y, dtype=float)
    x = np.arange(len(y), dtype=float) if x is None else np.asarray(x, dtype=float)
    ok = np.isfinite(y) & np.isfinite(x)
    if ok.sum() < 2:
        return math.nan
    x, y = x[ok], y[ok]
    dx = x - x.mean()
    denom = (dx * dx).sum()
    return float((dx * (y - y.mean())).sum() / denom) if denom > 0 else math.nan


def cusum(increments: np.ndarray, s0: float = 0.0) -> np.ndarray:
    """One-sided CUSUM S_t = max(0, S_{t-1} + x_t) from S_{-1} = s0, vectorised (NaN increments count 0).

    The Lindley recursion has the closed form S_t = C_t - min(-s0, min_{j<=t} C_j) with C the
    cumulative sum, so a million steps cost one cumsum and one running minimum; `s0` carries the
    statistic across chunks (the online monitor evaluates one step at a time with it)."""
    c = np.cumsum(np.where(np.isfinite(increments), increments, 0.0))
    if not len(c):
        return c
    return c - np.minimum(np.minimum.accumulate(c), -s0)


def cusum_arl0(k: float, h: float) -> float:
    """Siegmund's approximation of a Gaussian CUSUM's in-control average run length (steps between
    false alarms) for allowance k and threshold h, both in standard deviations:
    ARL0 = (exp(2kb) - 2kb - 1) / (2k^2), b = h + 1.166. k = 0.5, h = 8 -> ~19,000 steps."""
    b = h + 1.166
    return (math.exp(2 * k * b) - 2 * k * b - 1) / (2 * k * k)


def diff_noise(x: np.ndarray) -> float:
    """Per-step noise sd of a series with a slow trend, from its first differences (a difference of two
    independent draws has sd sigma * sqrt 2; the trend cancels): the larger of the robust estimate
    (1.4826 * MAD / sqrt 2) and the plain one (sd / sqrt 2). The MAD undercounts on a lattice (a
    fraction of B completions moves in steps of 1/B, and its MAD is quantised low, even 0 for a 0/1
    series); the sd overcounts on heavy tails. The larger errs towards fewer false alarms. NaN if < 3 values."""
    v = x[np.isfinite(x)]
    if len(v) < 3:
        return math.nan
    d = np.diff(v)
    mad = float(np.median(np.abs(d - np.median(d))))
    return max(1.4826 * mad, float(np.std(d, ddof=1))) / math.sqrt(2)


def trailing_max(x: np.ndarray, m: int) -> np.ndarray:
    """Max over the trailing m values (NaN ignored; NaN where the window has none), in O(n): the
    van Herk / Gil-Werman block scheme (running maxima within blocks of m, forward and backward;
    the window ending at i spans at most two blocks)."""
    n, m = len(x), max(int(m), 1)
    if n == 0:
        return np.array([])
    v = np.where(np.isfinite(x), x, -np.inf)
    pad = (-n) % m
    blocks = np.concatenate([v, np.full(pad, -np.inf)]).reshape(-1, m)
    forward = np.maximum.accumulate(blocks, axis=1).ravel()[:n]  # max from the block start to i
    backward = np.maximum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()[:n]  # max from i to the block end
    out = forward.copy()
    start = np.arange(n) - m + 1
    ok = start >= 0
    out[ok] = np.maximum(backward[start[ok]], forward[ok])
    out[~ok] = forward[~ok] if m > n else np.maximum.accumulate(v)[~ok]
    out[~np.isfinite(out)] = np.nan
    return out


def repetition_rate(text: str, n: int = 4) -> float:
    """seq-rep-n of one completion (Welleck et al. 2019, "Neural text degeneration with unlikelihood
    training"): the share of its word n-grams that repeat an earlier n-gram of the same completion,
    1 - distinct / total. 0 for a completion with no n-gram (fewer than n words: nothing to repeat).
    Words, not tokens: a loop reads the same in any tokenizer. Human text repeats ~1 % of its 4-grams,
    greedy decoding of a likelihood-trained LM ~40 % (ibid.)."""
    words = text.split()
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0
