"""The online monitor is `diagnose`, one step at a time: same verdicts at every step, bounded memory
(so a step costs the same at step 100 and at step 1,000,000), and a resumed run continues exactly."""

import math

import numpy as np
import pytest

import zoo
from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.health.monitor import HealthMonitor
from grpo_sentinel.telemetry.health.runlog import RunLog
from grpo_sentinel.telemetry.health.thresholds import Thresholds, lookback
from grpo_sentinel.telemetry.schema import RunInfo, Scales, StepStats

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)


def monitor_for(log: RunLog, th: Thresholds = Thresholds()) -> HealthMonitor:
    m = HealthMonitor(frozenset(), frozenset(), th, group_size=log.group_size)
    m.start(RunInfo("r", "m", "grpo", Scales(log.max_reward, log.ln_vocab, log.max_new_tokens)))
    m._eval_n = log.eval_n  # the trainer learns n at its first evaluation; the zoo knows it up front
    return m


def rows(log: RunLog, lo: int = 0, hi: int | None = None):
    for i in range(lo, len(log) if hi is None else hi):
        yield {k: float(v[i]) for k, v in log.series.items()}


# The first tier's share of the zoo: a healthy run and the rows whose state carries furthest (a CUSUM, the KL's
# forecast, the early baseline, the held-out peak, the loss blocks); every scenario in the second.
FIRST_TIER = {"healthy", "kl_acceleration", "entropy_blowup", "late_degradation", "loss_blowup", "length_drift"}


@pytest.mark.parametrize("gen", [pytest.param(g, marks=() if g.__name__ in FIRST_TIER else pytest.mark.slow)
                                 for g in zoo.ZOO], ids=lambda g: g.__name__)
def test_online_verdicts_are_the_offline_ones_at_every_step(gen):
    log = zoo.make(gen, 0)
    offline = diagnose(log)
    m = monitor_for(log)
    for i, row in enumerate(rows(log)):
        online = {c.id for c in m.judge(row).active}
        assert online == {cid for cid, mask in offline.masks.items() if mask[i]}, (i + 1, online)
        assert len(m._rows["step"]) <= lookback(m.thresholds)  # a bounded tail: the cost of a step is bounded


def test_the_exported_entropy_baseline_is_the_diagnosis_one():
    log = zoo.make(zoo.entropy_blowup, 0)
    m = monitor_for(log)
    verdicts = [m.judge(row) for row in rows(log)]
    early = 2 * m.thresholds.window
    # While the early period fills, the exported baseline is the median so far; then it is fixed.
    assert verdicts[0].entropy_baseline == log.series["entropy"][0]
    assert verdicts[early - 2].entropy_baseline == np.median(log.series["entropy"][:early - 1])
    assert {v.entropy_baseline for v in verdicts[early - 1:]} == {diagnose(log).entropy_baseline}


@pytest.mark.parametrize("gen", [zoo.loss_blowup, zoo.format_hacking, zoo.kl_dominant, zoo.late_degradation],
                         ids=lambda g: g.__name__)
def test_a_resumed_monitor_continues_exactly(gen):
    """seed() replays the record in one vectorised pass: CUSUMs, peaks, early statistics and the
    recent evaluation points continue as if the run had never stopped."""
    log = zoo.make(gen, 1)
    whole = monitor_for(log)
    expected = [{c.id for c in whole.judge(row).active} for row in rows(log)]
    cut = 173
    head = RunLog({k: v[:cut] for k, v in log.series.items()}, "record", "sentinel")
    resumed = monitor_for(log)
    resumed.seed(head)
    got = [{c.id for c in resumed.judge(row).active} for row in rows(log, cut)]
    assert got == expected[cut:]


@pytest.mark.slow
def test_per_step_state_does_not_grow_with_the_run():
    """5,000 steps: the tail stays at lookback() rows and the carried state at a handful of numbers, the same
    at step 1,000 as at step 5,000."""
    n = 5_000
    rng = np.random.default_rng(0)
    t = np.arange(1, n + 1, dtype=float)
    p = 0.2 + 0.4 * (1 - np.exp(-t / 1250))
    acc = np.full(n, np.nan)
    acc[19::20] = rng.binomial(200, p[19::20]) / 200
    series = {"step": t, "reward": rng.binomial(64, p) / 64, "kl": 0.01 + 0.001 * rng.standard_normal(n),
              "loss": 0.01 * rng.standard_normal(n), "entropy": 0.6 + 0.02 * rng.standard_normal(n),
              "sample_acc": acc, "_nonfinite": np.zeros(n)}
    log = RunLog(series, "long", "sentinel", eval_n=200, ln_vocab=math.log(15), max_new_tokens=64)
    m = monitor_for(log)
    sizes = []
    for i, row in enumerate(rows(log)):
        m.judge(row)
        if i in (1_000, n - 1):
            sizes.append((len(m._rows["step"]), sum(np.size(v) if not isinstance(v, dict) else sum(map(np.size, v.values()))
                                                    for v in m._state.values())))
    assert sizes[0] == sizes[1] and sizes[0][0] == lookback(m.thresholds), sizes


def test_the_stamped_record_says_which_conditions_are_critical_now():
    """A drift row is critical from the step its critical stage begins: the record every sink reads
    (StepStats.health_critical, exported as the condition's severity) says so at exactly the steps
    where `diagnose` has it critical."""
    log = zoo.make(zoo.kl_acceleration, 0)
    critical = [c for c in diagnose(log).conditions if c.id == "kl_acceleration" and c.severity == "critical"]
    assert critical, "the scenario escalates"
    first, last = critical[0].first_step, critical[-1].last_step
    m = monitor_for(log)
    stamped = {int(row["step"]): m.judge(row).stamp(StepStats.partial(int(row["step"]))) for row in rows(log)}
    assert "kl_acceleration" in stamped[first].health_critical
    assert not [s for s in stamped if s < first and "kl_acceleration" in stamped[s].health_critical]
    assert all("kl_acceleration" in stamped[s].health_critical for s in range(first, last + 1)
               if any(c.first_step <= s <= c.last_step for c in critical))
