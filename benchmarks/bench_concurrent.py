"""Two demo runs at once on the same cores, against one alone: the cost of sharing a machine.

Each process of `grpo-sentinel train` takes its share of the cores (service/cpu.py). Without it, each took
every core and their OpenMP threads spun against each other (0.11 s a step alone became 0.47 s each on 2
cores). For each round: one run alone, then two started together; the median step time of each (its first
two steps dropped: the start) against the alone run's, rounds interleaved so that drift in the machine hits
both alike. `--share off` runs the same with every process told to take every core (the old behaviour).

    python benchmarks/bench_concurrent.py [--rounds 3] [--steps 40] [--share auto|off]

Target (issue 40): each concurrent run within 1.3x of one alone.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import machine


def launch(out: Path, run_id: str, steps: int, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "grpo_sentinel.service.cli", "train", "--steps", str(steps),
                             "--out", str(out), "--set", f"run.run_id={run_id}", "--set", "telemetry.prometheus=false",
                             "--set", "data.eval_size=20", "--set", f"run.sample_every={steps}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def step_time(run: Path) -> float:
    rows = list(csv.DictReader((run / "steps.csv").open()))
    return statistics.median(float(r["step_time"]) for r in rows[2:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--share", choices=("auto", "off"), default="auto",
                    help="off: every process takes every core (OMP_NUM_THREADS = the cores), as before service/cpu.py")
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("OMP_NUM_THREADS", None)
    if args.share == "off":
        env["OMP_NUM_THREADS"] = str(len(os.sched_getaffinity(0)))
    print(machine())
    alone, together = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for r in range(args.rounds):
            p = launch(out, f"alone-{r}", args.steps, env)
            assert p.wait() == 0, "the run alone failed"
            alone.append(step_time(out / f"alone-{r}"))
            pair = [launch(out, f"pair-{r}-{i}", args.steps, env) for i in range(2)]
            assert all(p.wait() == 0 for p in pair), "a concurrent run failed"
            together += [step_time(out / f"pair-{r}-{i}") for i in range(2)]
            print(f"round {r + 1}: alone {alone[-1] * 1e3:.0f} ms a step; together "
                  f"{together[-2] * 1e3:.0f} and {together[-1] * 1e3:.0f} ms", flush=True)
    base = statistics.median(alone)
    worst = max(together) / base
    print(f"median step: alone {base * 1e3:.0f} ms, together {statistics.median(together) * 1e3:.0f} ms "
          f"({statistics.median(together) / base:.2f}x); the slowest concurrent run {worst:.2f}x "
          f"(target <= 1.3x, share={args.share})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
