"""What SentinelCallback costs a TRL run: the same GRPOTrainer on the demo model with and without it.

Variants, each in a fresh process, interleaved `--repeats` times (drift on a shared machine hits every
variant alike): `trl` (no callback), `callback` (the callback on TRL's logged means) and `wrapped` (the
callback and wrapped reward functions: per-completion metrics). All at equal precision (fp32, bf16=False:
this CPU emulates bf16), logging every step (the callback's most work), /metrics served on a free port.
A step's time is the wall time between consecutive on_step_begin events, so it includes on_log, where
the callback works (the end of training, where it closes its sinks, is not a step); the median after
two warm-up steps is compared.

    pip install -e '.[bench]'
    python benchmarks/bench_trl_callback.py [--repeats 3] [--steps 14]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

G, PROMPTS, MAX_NEW = 8, 8, 6
VARIANTS = ["trl", "callback", "wrapped"]


def worker(variant: str, steps: int, tmp: Path) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_sentinel.integrations.trl import SentinelCallback
    from grpo_sentinel.service.data import addition_examples
    from grpo_sentinel.service.demo import demo_model_dir

    rows = [{"prompt": e.prompt, "answer": e.answer} for e in addition_examples()]

    def correct(prompts, completions, answer, **_):
        return [float(c.strip() == a) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        starts: list[float] = []

        def on_step_begin(self, *a, **k):
            self.starts.append(time.perf_counter())

    clock = Clock()
    callbacks: list = [clock]
    rewards = [correct]
    if variant != "trl":
        callbacks.append(SentinelCallback(out_dir=tmp / "runs", telemetry={"prometheus_port": 0}))
    if variant == "wrapped":
        rewards = SentinelCallback.wrap_rewards(rewards)
    args = GRPOConfig(output_dir=str(tmp / "out"), use_cpu=True, bf16=False, gradient_checkpointing=False,
                      per_device_train_batch_size=G * PROMPTS, num_generations=G, max_completion_length=MAX_NEW,
                      beta=0.04, learning_rate=1e-3, max_steps=steps, logging_steps=1, save_strategy="no", report_to=[],
                      disable_tqdm=True)
    trainer = GRPOTrainer(model=str(demo_model_dir()), reward_funcs=rewards, args=args,
                          train_dataset=Dataset.from_list(rows), callbacks=callbacks,
                          peft_config=LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    trainer.train()
    return [b - a for a, b in zip(clock.starts, clock.starts[1:])]


def measure(variant: str, steps: int) -> float:
    """Median step seconds of one fresh process, after two warm-up steps."""
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, __file__, "--worker", variant, "--steps", str(steps), "--tmp", tmp],
                             capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if out.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{out.stderr[-3000:]}")
    times = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--worker", choices=VARIANTS)
    ap.add_argument("--tmp", type=Path)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.tmp)))
        return
    results: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS:  # interleaved
            results[v].append(measure(v, args.steps))
            print(f"  repeat {r + 1} {v}: {results[v][-1] * 1000:.0f} ms/step", flush=True)
    med = {v: statistics.median(t) for v, t in results.items()}
    print(f"median step (G={G}, prompts={PROMPTS}, max_new_tokens={MAX_NEW}, fp32, logging_steps=1, "
          f"{args.repeats} processes each): " + ", ".join(f"{v} {med[v] * 1000:.0f} ms" for v in VARIANTS))
    for v in VARIANTS[1:]:
        print(f"  {v} / trl: {med[v] / med['trl']:.3f}x")


if __name__ == "__main__":
    main()
