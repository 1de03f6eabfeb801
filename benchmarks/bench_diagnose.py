"""`diagnose` on a long log: a 1,000,000-step synthetic run through every detector.

    python benchmarks/bench_diagnose.py [--steps 1000000]
"""

import argparse
import time

import numpy as np

from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.health.ingest import RunLog


def synthetic(n: int, seed: int = 0) -> RunLog:
    rng = np.random.default_rng(seed)
    t = np.arange(1, n + 1, dtype=float)
    p = 0.2 + 0.4 * (1 - np.exp(-t / (n / 3)))
    reward = rng.binomial(64, p) / 64
    acc = np.full(n, np.nan)
    acc[19::20] = rng.binomial(200, p[19::20]) / 200
    zero = rng.binomial(8, p**8 + (1 - p) ** 8) / 8
    series = {"step": t, "reward": reward, "train_acc": reward, "kl": 0.002 + 0.05 * t / n, "loss": 0.002 * rng.standard_normal(n),
              "entropy": 0.6 + 0.03 * rng.standard_normal(n), "adv_mean": 1e-8 * rng.standard_normal(n),
              "frac_zero_std": zero, "frac_zero_std_correct": zero / 2, "frac_zero_std_wrong": zero / 2,
              "response_len": 3.5 + 0.1 * rng.standard_normal(n), "truncation_rate": np.zeros(n), "sample_acc": acc,
              "_nonfinite": np.zeros(n)}
    return RunLog(series, "synthetic", "sentinel", group_size=8, max_new_tokens=64, ln_vocab=float(np.log(15)), eval_n=200)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1_000_000)
    args = ap.parse_args()
    log = synthetic(args.steps)
    t0 = time.perf_counter()
    d = diagnose(log)
    dt = time.perf_counter() - t0
    print(f"diagnose: {args.steps:,} steps in {dt:.2f} s ({len(d.conditions)} conditions; target <= 2 s)")


if __name__ == "__main__":
    main()
