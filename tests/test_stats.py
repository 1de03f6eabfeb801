"""MISSION.md golden values for the stats ruler, arithmetic written out."""

import math

import numpy as np
import pytest

from grpo_sentinel.telemetry.stats import mean, moving_average, percentile, sd, slope, summarize, windowed_sd

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)


def test_percentile_golden_and_contract():
    xs = [0.9, 0.2, 0.5, 0.3, 0.4]  # unsorted on purpose
    before = list(xs)
    # sorted [0.2, 0.3, 0.4, 0.5, 0.9]; p50: idx 2 -> 0.4
    assert percentile(xs, 50) == pytest.approx(0.4)
    # p95: idx 0.95 * 4 = 3.8 -> 0.5 * 0.2 + 0.9 * 0.8 = 0.82
    assert percentile(xs, 95) == pytest.approx(0.82)
    assert mean(xs) == pytest.approx(0.46)
    assert xs == before  # not mutated
    assert math.isnan(percentile([], 50))
    assert percentile([7.0], 99) == 7.0


def test_sd_golden():
    # mean 0.44; squares of deviations 0.0016+0.0004+0+0.0004+0.0016 = 0.004; /4 = 0.001; sqrt = 0.0316
    assert round(sd([0.40, 0.42, 0.44, 0.46, 0.48]), 4) == 0.0316
    # mean 0.47; deviations -.07 .13 -.12 .15 -.09 -> squares sum 0.0668; /4 = 0.0167; sqrt = 0.1292
    assert round(sd([0.40, 0.60, 0.35, 0.62, 0.38]), 4) == 0.1292
    assert sd([1.0]) == 0.0 and sd([]) == 0.0


def test_summarize():
    s = summarize([0.2, 0.3, 0.4, 0.5, 0.9, float("nan")])
    assert s["n"] == 5 and s["p50"] == pytest.approx(0.4) and s["p95"] == pytest.approx(0.82)
    assert s["mean"] == pytest.approx(0.46)


def test_windowed_helpers_match_the_scalar_ruler():
    x = np.array([0.40, 0.60, 0.35, 0.62, 0.38, np.nan, 0.5])
    ws = windowed_sd(x, 5)
    assert round(ws[4], 4) == 0.1292  # the sawtooth window
    assert ws[0] == 0.0  # one value: 0
    assert moving_average(x, 2)[5] == pytest.approx(0.38)  # the NaN is skipped
    assert moving_average(x, 3)[6] == pytest.approx((0.38 + 0.5) / 2)


def test_slope_sees_a_trend_in_quantised_rewards():
    # rewards in steps of 1/8 that rise by 0.25 over 100 steps: differences are mostly 0,
    # the least-squares slope is not.
    y = np.round(np.linspace(0.25, 0.5, 100) * 8) / 8
    assert slope(y) == pytest.approx(0.25 / 99, rel=0.15)
    assert np.count_nonzero(np.diff(y)) == 2  # a difference-based trend would read ~0
    assert math.isnan(slope([1.0]))


def test_cusum_arl0_is_siegmunds_approximation_and_matches_a_simulation():
    from grpo_sentinel.telemetry.stats import cusum_arl0

    # The classic design point k = 0.5, h = 4: ARL0 ~ 336 steps (Montgomery, Statistical Quality Control,
    # table of CUSUM ARLs); Siegmund gives (e^5.166 - 5.166 - 1) / 0.5 = 338.
    assert cusum_arl0(0.5, 4) == pytest.approx((math.exp(5.166) - 6.166) / 0.5) == pytest.approx(336, rel=0.01)
    # docs/explanation/lead-time.md's figure for the detectors' h = 8: ~19,000 steps between false alarms.
    assert cusum_arl0(0.5, 8) == pytest.approx(19_100, rel=0.01)
    # A simulated in-control CUSUM S_t = max(0, S_{t-1} + x_t - k), x ~ N(0, 1), runs that long at h = 4.
    rng = np.random.default_rng(0)
    s, alive, length = np.zeros(4000), np.ones(4000, dtype=bool), np.zeros(4000)
    for _ in range(5000):
        s = np.maximum(0.0, s + rng.standard_normal(4000) - 0.5)
        length += alive
        alive &= s < 4
    assert not alive.any() and length.mean() == pytest.approx(336, rel=0.05)
