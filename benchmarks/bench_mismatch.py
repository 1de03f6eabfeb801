"""What measuring the train/inference mismatch costs a step, and the rollout backends' step time side by side.

1. The measurement (every run pays it): the sampler's log-prob of each drawn token (a gather and a log of the
   probabilities the draw computes anyway), the gap to the trainer's log-prob, the importance weights
   (grpo.is_correction) and the step's statistics (service/grpo/step.py mismatch_sums). Timed on the demo step's
   own tensors (B = 64 completions, its completion length, V = the demo's vocabulary) against the demo step's
   median wall time, both in this process. Target (issue 42): at most 1 % of a step.
2. With `--backends`: `grpo-sentinel train` on the demo for `--steps` steps with rollout.backend=hf and =vllm (this
   interpreter must have vLLM: run it with the vLLM venv's python, docs/guides/vllm.md), the median step time of
   each (its first two steps dropped: the engine's start and the first hand-over) and the mismatch they record.

    python benchmarks/bench_mismatch.py [--repeats 200]
    .venv-vllm/bin/python benchmarks/bench_mismatch.py --backends --steps 40
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import SETTINGS, machine, model_dir, ours


def measurement_cost(repeats: int) -> None:
    import torch

    from grpo_sentinel.service.grpo import math as gm
    from grpo_sentinel.service.grpo.step import mismatch_sums

    with tempfile.TemporaryDirectory() as tmp:
        run = ours(model_dir("demo", Path(tmp)), SETTINGS["demo"])
        steps = []
        for _ in range(30):
            t0 = time.perf_counter()
            stats = run.next()
            steps.append(time.perf_counter() - t0)
    step = statistics.median(steps[5:])
    B, T, V = 64, max(2, round(stats.response_len + 1)), run.policy.model.get_output_embeddings().weight.shape[0]
    probs = torch.softmax(torch.randn(B, V), -1)
    token = probs.argmax(-1)
    mask = torch.ones(B, T)
    trainer, sampler = torch.randn(B, T) * 0.1 - 2, torch.randn(B, T) * 0.1 - 2
    t0 = time.perf_counter()
    for _ in range(repeats):
        for _ in range(T):  # the draw's extra work, once a token
            probs.gather(-1, token[:, None]).squeeze(-1).log()
        gap = (trainer - sampler) * mask
        w, changed = gm.importance_weights(gap, mask, "sequence_mask", None, 3.0)
        mismatch_sums(gap, mask.bool(), changed)
        torch.abs(gap[mask.bool()]).numpy()
    cost = (time.perf_counter() - t0) / repeats
    print(f"demo step (median of 25): {step * 1e3:.1f} ms; the mismatch measurement: {cost * 1e6:.0f} us "
          f"({100 * cost / step:.2f} % of a step; target <= 1 %) [B={B}, T={T}, V={V}]")


def backends(steps: int) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = {}
        for backend in ("hf", "vllm"):
            p = subprocess.run([sys.executable, "-m", "grpo_sentinel.service.cli", "train", "--steps", str(steps),
                                "--out", tmp, "--set", f"run.run_id={backend}", "--set", "telemetry.prometheus=false",
                                "--set", f"rollout.backend={backend}", "--set", f"run.sample_every={steps}",
                                "--set", "data.eval_size=20"], capture_output=True, text=True, env=env)
            if p.returncode:
                sys.exit(f"{backend}: {p.stderr[-2000:]}")
            rows = list(csv.DictReader((Path(tmp) / backend / "steps.csv").open()))[2:]
            out[backend] = (statistics.median(float(r["step_time"]) for r in rows),
                            statistics.median(float(r["logp_diff_mean"]) for r in rows))
    for backend, (t, gap) in out.items():
        print(f"rollout.backend={backend}: median step {t * 1e3:.0f} ms, median mean |log-prob gap| {gap:.2e}")
    print(f"vllm / hf step time: {out['vllm'][0] / out['hf'][0]:.2f}x (the demo's 6-token completions on a CPU; "
          "vLLM's case is long completions on a GPU, which this machine cannot show)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--backends", action="store_true", help="time the two rollout backends instead (needs vLLM)")
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    print(machine())
    if args.backends:
        backends(args.steps)
    else:
        measurement_cost(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
