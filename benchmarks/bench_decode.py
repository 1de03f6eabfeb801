"""Sampling alone: the decoder (service/grpo/decoder.py) against HF's forward for every token.

One process, the two paths alternating call by call (drift on a loaded machine hits both alike), each
`sample()` of G = 8 completions of 8 prompts with the demo model and a LoRA adapter that is not zero;
the median per path and the median of the paired ratios. Then `--steps` GRPO steps of the demo with
each path from the same seed: how far apart the step statistics (loss, grad norm, KL, reward, entropy) are
(the decoder rounds differently from HF's forward; a flipped draw makes the runs part).

    python benchmarks/bench_decode.py [--repeats 16] [--steps 5] [--threads 1] [--clock cpu]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
PROMPTS = ["12+34=", "7+8=", "99+1=", "5+55=", "40+2=", "3+3=", "61+19=", "8+80="]


def sampling(setting: str, repeats: int, tmp: Path, clock) -> dict[bool, list[float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_sentinel.service.grpo.rollout import sample

    path = common.model_dir(setting, tmp)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = common.trained_adapter(AutoModelForCausalLM.from_pretrained(path))
    prompts = [p for p in PROMPTS for _ in range(common.G)]
    times = {True: [], False: []}  # exact (HF's forward) -> seconds per sample()
    for r in range(repeats + 1):
        for exact in (True, False):
            torch.manual_seed(r)
            t0 = clock()
            sample(model.eval(), tokenizer, prompts, max_new_tokens=common.SETTINGS[setting], exact=exact)
            if r:  # the first round warms up
                times[exact].append(clock() - t0)
    return times


def step_difference(steps: int) -> float:
    """The largest relative difference between the two paths' step statistics over `steps` demo steps."""
    from grpo_sentinel.service.demo import demo_model_dir
    from grpo_sentinel.service.grpo import rollout, step

    stats = {}
    for exact in (False, True):
        step.sample = functools.partial(rollout.sample, exact=exact)
        run = common.ours(demo_model_dir(), common.SETTINGS["demo"])
        stats[exact] = [(s.loss, s.grad_norm, s.kl, s.reward, s.entropy) for s in (run.next() for _ in range(steps))]
    return max(abs(a - b) / max(abs(b), 1e-12) for fast, exact in zip(stats[False], stats[True])
               for a, b in zip(fast, exact))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--clock", choices=list(CLOCKS), default="wall")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print(common.machine() + f"; clock: {args.clock}")
    with tempfile.TemporaryDirectory() as tmp:
        for setting in common.SETTINGS:
            t = sampling(setting, args.repeats, Path(tmp), CLOCKS[args.clock])
            ratios = sorted(a / b for a, b in zip(t[True], t[False]))
            paired, spread = statistics.median(ratios), f"{ratios[len(ratios) // 4]:.2f}-{ratios[-1 - len(ratios) // 4]:.2f}"
            print(f"{setting} (max_new_tokens {common.SETTINGS[setting]}, {common.G} x {len(PROMPTS)} completions): "
                  f"HF forward {1e3 * statistics.median(t[True]):.1f} ms, decoder {1e3 * statistics.median(t[False]):.1f}"
                  f" ms per sample() (median of {args.repeats}); paired ratio {paired:.2f}x (interquartile {spread})", flush=True)
    if args.steps:
        diff = step_difference(args.steps)
        verdict = "bit for bit the same" if diff == 0 else f"equal to a relative {diff:.1e} (rounding)"
        print(f"{args.steps} demo GRPO steps, decoder vs HF forward: loss, grad norm, KL, reward, entropy {verdict}")


if __name__ == "__main__":
    main()
