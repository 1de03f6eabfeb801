"""`diagnose` on a long log, and the online monitor's cost per step as the run grows.

- diagnose: a 1,000,000-step synthetic run through every detector (target: under 2 s).
- monitor: the trainer's per-step health evaluation after 1,000, 10,000, 100,000 and 1,000,000 steps
  of history (the history is replayed with `seed()`, as a resumed run does; then 300 steps are
  timed one by one). It must not grow with the run: the monitor keeps a bounded tail and carried
  state. For contrast, what re-running `diagnose` over the whole history each step would cost.

    python benchmarks/bench_diagnose.py [--steps 1000000]
"""

import argparse
import logging
import math
import time

import numpy as np

from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.health.monitor import HealthMonitor
from grpo_sentinel.telemetry.health.runlog import RunLog
from grpo_sentinel.telemetry.health.thresholds import Thresholds
from grpo_sentinel.telemetry.schema import RunInfo, Scales


def synthetic(n: int, seed: int = 0) -> RunLog:
    rng = np.random.default_rng(seed)
    t = np.arange(1, n + 1, dtype=float)
    p = 0.2 + 0.4 * (1 - np.exp(-t / (n / 3)))
    reward = rng.binomial(64, p) / 64
    acc = np.full(n, np.nan)
    acc[19::20] = rng.binomial(200, p[19::20]) / 200
    zero = rng.binomial(8, p**8 + (1 - p) ** 8) / 8
    fmt = rng.binomial(64, 0.9, n) / 64
    series = {"step": t, "reward": reward + fmt, "train_acc": reward, "reward_correct": reward, "reward_format": fmt,
              "reward_aux": fmt, "kl": 0.002 + 0.05 * t / n, "loss": 0.002 * rng.standard_normal(n),
              "entropy": 0.6 + 0.03 * rng.standard_normal(n), "adv_mean": 1e-8 * rng.standard_normal(n),
              "frac_zero_std": zero, "frac_zero_std_correct": zero / 2, "frac_zero_std_wrong": zero / 2,
              "response_len": 3.5 + 0.1 * rng.standard_normal(n), "truncation_rate": np.zeros(n), "sample_acc": acc,
              "_nonfinite": np.zeros(n)}
    return RunLog(series, "synthetic", "sentinel", group_size=8, max_new_tokens=64, ln_vocab=float(np.log(15)),
                  eval_n=200, max_reward=2.0)


def monitor_cost(history: int, timed: int = 300) -> tuple[float, float]:
    """(median, p99) ms per step after `history` steps."""
    log = synthetic(history + timed)
    head = RunLog({k: v[:history] for k, v in log.series.items()}, "history", "sentinel", eval_n=200)
    m = HealthMonitor(frozenset(), frozenset(), Thresholds(), group_size=8)
    m.start(RunInfo("bench", "synthetic", "grpo", Scales(2.0, math.log(15), 64)))
    m.seed(head)
    times = []
    for i in range(history, history + timed):
        row = {k: float(v[i]) for k, v in log.series.items()}
        t0 = time.perf_counter()
        m.judge(row)
        times.append(time.perf_counter() - t0)
    ms = 1000 * np.array(times)
    return float(np.median(ms)), float(np.percentile(ms, 99))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    args = ap.parse_args()
    logging.disable(logging.CRITICAL)  # the synthetic run's verdicts are not what is measured here
    log = synthetic(args.steps)
    t0 = time.perf_counter()
    d = diagnose(log)
    dt = time.perf_counter() - t0
    print(f"diagnose: {args.steps:,} steps in {dt:.2f} s ({len(d.conditions)} conditions; target <= 2 s)")
    for history in (1_000, 10_000, 100_000, 1_000_000):
        med, p99 = monitor_cost(history)
        full = synthetic(history)
        t0 = time.perf_counter()
        diagnose(full)
        rerun = 1000 * (time.perf_counter() - t0)
        print(f"monitor after {history:>9,} steps: {med:.2f} ms a step (p99 {p99:.2f} ms); "
              f"re-running diagnose over the history would cost {rerun:.0f} ms a step")


if __name__ == "__main__":
    main()
