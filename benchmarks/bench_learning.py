"""Does the default demo learn? Runs `grpo-sentinel train` (300 steps) over several seeds, one at
a time, and prints held-out accuracy at step 0 and at the end (mean of the last three sampling
points, to average out evaluation noise), per seed and as mean +- sd.

    python benchmarks/bench_learning.py --seeds 0 1 2 [--steps 300]
"""

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(seed: int, steps: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "grpo_sentinel.service.cli", "train", "--steps", str(steps), "--out", str(out),
                    "--set", f"run.seed={seed}", "--set", f"run.run_id=seed{seed}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = list(csv.DictReader((out / f"seed{seed}" / "reward-vs-step.csv").open()))
    acc = {k: [float(r[k]) for r in rows] for k in ("sample_acc", "greedy_acc")}
    return {k: (v[0], statistics.mean(v[-3:])) for k, v in acc.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    gains = {"sample_acc": [], "greedy_acc": []}
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'seed':>4} {'sample_acc 0 -> end':>22} {'greedy_acc 0 -> end':>22}")
        for seed in args.seeds:
            r = run(seed, args.steps, Path(tmp))
            for k in gains:
                gains[k].append(r[k][1] - r[k][0])
            print(f"{seed:>4} " + " ".join(f"{r[k][0]:>8.3f} -> {r[k][1]:.3f} ({r[k][1] - r[k][0]:+.3f})" for k in gains),
                  flush=True)
    for k, g in gains.items():
        sd = statistics.stdev(g) if len(g) > 1 else 0.0
        print(f"{k} gain over {len(g)} seeds: mean {statistics.mean(g):+.3f}, sd {sd:.3f}, min {min(g):+.3f}")


if __name__ == "__main__":
    main()
