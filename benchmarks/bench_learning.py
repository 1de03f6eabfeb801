"""Does the default demo learn? Runs `grpo-sentinel train` (300 steps) over several seeds, one at
a time, and prints held-out accuracy at step 0 and at the end (mean of the last three sampling
points, to average out evaluation noise), per seed and as mean +- sd.

    python benchmarks/bench_learning.py --seeds 0 1 2 3 [--steps 300] [--at REV]

`--at REV` also trains the same seeds with the code as it was at git revision REV (e.g. the "before"
of docs/benchmarks.md) and prints the difference of the mean gains with its standard error: a
change that should alter speed, not the algorithm, should leave it within noise.
"""

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

METRICS = ("sample_acc", "greedy_acc")


def run(seed: int, steps: int, out: Path, env: dict | None) -> dict:
    subprocess.run([sys.executable, "-m", "grpo_sentinel.service.cli", "train", "--steps", str(steps), "--out", str(out),
                    "--set", f"run.seed={seed}", "--set", f"run.run_id=seed{seed}"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    rows = list(csv.DictReader((out / f"seed{seed}" / "reward-vs-step.csv").open()))
    acc = {k: [float(r[k]) for r in rows] for k in METRICS}
    return {k: (v[0], statistics.mean(v[-3:])) for k, v in acc.items()}


def summary(gains: list[float]) -> tuple[float, float]:
    """Mean and sample sd of the per-seed gains (sd 0 for one seed)."""
    return statistics.mean(gains), statistics.stdev(gains) if len(gains) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--at", metavar="REV", help="also train with the code at this git revision")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"today": None}
        if args.at:
            variants[args.at] = common.code_at(args.at, Path(tmp))
        gains = {v: {k: [] for k in METRICS} for v in variants}
        print(f"{'code':>10} {'seed':>4} {'sample_acc 0 -> end':>22} {'greedy_acc 0 -> end':>22}")
        for seed in args.seeds:  # the variants alternate seed by seed: a slow spell of the machine hits both
            for name, env in variants.items():
                r = run(seed, args.steps, Path(tmp) / name, env)
                for k in METRICS:
                    gains[name][k].append(r[k][1] - r[k][0])
                print(f"{name:>10} {seed:>4} " + " ".join(f"{r[k][0]:>8.3f} -> {r[k][1]:.3f} ({r[k][1] - r[k][0]:+.3f})"
                                                           for k in METRICS), flush=True)
    for name in variants:
        for k, g in gains[name].items():
            mean, sd = summary(g)
            print(f"{name}: {k} gain over {len(g)} seeds: mean {mean:+.3f}, sd {sd:.3f}, min {min(g):+.3f}")
    if args.at:  # paired by seed: both sides start from the same run.seed
        for k in METRICS:
            diff = [a - b for a, b in zip(gains["today"][k], gains[args.at][k])]
            mean, sd = summary(diff)
            se = sd / len(diff) ** 0.5
            print(f"today - {args.at}: {k} gain {mean:+.3f} (paired by seed, standard error {se:.3f})")


if __name__ == "__main__":
    main()
