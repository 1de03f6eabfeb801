"""Throughput against the anchor: our GRPO step vs TRL's GRPOTrainer on the same tiny model.

Same model directory, prompts (the same text, tokenised by each), G, prompts per step,
max_new_tokens, LoRA rank and alpha, beta > 0, loss type, on the CPU. The anchor is TRL at our
precision: fp32 (`bf16=False`) without gradient checkpointing. TRL's defaults (bf16 autocast,
gradient checkpointing) are a second line: on a CPU without bf16 instructions bf16 is emulated
and ~8x slower, so that line says more about the CPU than about either trainer.

Variants run interleaved, each in a fresh process, `--repeats` times; the median step time after
two warm-up steps gives completions/s; ratios come from the same run. Two settings (see
common.py): the demo task (max_new_tokens 6) and 32-token completions.

    pip install -e '.[bench]'
    python benchmarks/bench_vs_trl.py [--repeats 3] [--steps 12] [--ours-at REV]

`--ours-at REV` adds our step as it was at git revision REV as one more interleaved variant (before/after).
On a machine others are using, `--threads 1 --clock cpu` gives ratios that contention moves far less
(process CPU time of single-threaded workers; two threads spinning on a shared core inflate both clocks).
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

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402
from common import BETA, LR, PROMPTS, RANK, SETTINGS, TARGETS, G  # noqa: E402

VARIANTS = ["ours", "trl_fp32", "trl_default"]
ANCHOR = "trl_fp32"
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def worker_ours(path: Path, max_new: int, steps: int, clock) -> dict:
    run = common.ours(path, max_new)
    times = []
    for _ in range(steps):
        t0 = clock()
        run.next()
        times.append(clock() - t0)
    return {"times": times, "precision": f"weights {run.cfg.model.dtype}, no checkpointing"}


def worker_trl(path: Path, max_new: int, steps: int, clock, defaults: bool) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_sentinel.service.data import Verifier, read_jsonl

    verifier = Verifier("exact")
    rows = [{"prompt": e.prompt, "answer": e.answer} for e in read_jsonl(common.dataset())]

    def correct(prompts, completions, answer, **_):
        return [float(verifier.is_correct(c, a)) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, *a, **k):
            self.t0 = clock()

        def on_step_end(self, *a, **k):
            self.times.append(clock() - self.t0)

    precision = {} if defaults else {"bf16": False, "gradient_checkpointing": False}
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, use_cpu=True, per_device_train_batch_size=G * PROMPTS, num_generations=G,
                          max_completion_length=max_new, beta=BETA, learning_rate=LR, loss_type="grpo",
                          max_steps=steps, logging_steps=10_000, save_strategy="no", report_to=[], **precision)
        timer = Clock()
        trainer = GRPOTrainer(model=str(path), reward_funcs=[correct], args=args, train_dataset=Dataset.from_list(rows),
                              peft_config=LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS,
                                                     task_type="CAUSAL_LM"), callbacks=[timer])
        trainer.train()
    autocast = "bf16 autocast" if args.bf16 else "no autocast"
    ckpt = "checkpointing" if args.gradient_checkpointing else "no checkpointing"
    return {"times": timer.times, "precision": f"weights {trainer.model.dtype}, {autocast}, {ckpt}"}


def measure(variant: str, setting: str, args, tmp: Path, env: dict | None = None) -> tuple[float, str]:
    """Median step seconds of one fresh process after two warm-up steps, and its precision."""
    worker = "ours" if variant.startswith("ours@") else variant
    threads = ["--threads", str(args.threads)] if args.threads else []
    out = subprocess.run([sys.executable, __file__, "--worker", worker, "--setting", setting, "--steps", str(args.steps),
                          "--tmp", str(tmp), "--clock", args.clock, *threads], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{variant}/{setting} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(res["times"][2:]), res["precision"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--worker", choices=VARIANTS)
    ap.add_argument("--setting", choices=list(SETTINGS))
    ap.add_argument("--tmp", type=Path)
    ap.add_argument("--ours-at", metavar="REV", help="also measure our step as it was at this git revision")
    ap.add_argument("--threads", type=int, help="torch threads per worker (default: torch's, one per core)")
    ap.add_argument("--clock", choices=list(CLOCKS), default="wall", help="wall time, or the process's CPU time")
    args = ap.parse_args()
    if args.worker:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        path, max_new, clock = common.model_dir(args.setting, args.tmp), SETTINGS[args.setting], CLOCKS[args.clock]
        if args.worker == "ours":
            res = worker_ours(path, max_new, args.steps, clock)
        else:
            res = worker_trl(path, max_new, args.steps, clock, defaults=args.worker == "trl_default")
        print(json.dumps(res))
        return
    print(common.machine() + (f"; workers: {args.threads} thread(s)" if args.threads else "") + f"; clock: {args.clock}")
    print(f"load average at start: {os.getloadavg()[0]:.2f} (other processes on these cores make every ratio noisy)")
    with tempfile.TemporaryDirectory() as tmp:
        variants = {v: None for v in VARIANTS}
        if args.ours_at:
            variants = {"ours": None, f"ours@{args.ours_at}": common.code_at(args.ours_at, Path(tmp)), **variants}
        for setting in args.settings:
            results, precision = {v: [] for v in variants}, {}
            for r in range(args.repeats):
                for v, env in variants.items():  # interleaved: drift on a noisy machine hits every variant alike
                    seconds, precision[v] = measure(v, setting, args, Path(tmp), env)
                    results[v].append(seconds)
                    print(f"  {setting} repeat {r + 1} {v}: {G * PROMPTS / seconds:.1f} completions/s", flush=True)
            med = {v: statistics.median(t) for v, t in results.items()}
            print(f"{setting} (max_new_tokens={SETTINGS[setting]}, G={G}, prompts={PROMPTS}, r={RANK}, beta={BETA}), "
                  f"median of {args.repeats}; ours / variant from the medians [median of the per-repeat ratios, their range]:")
            for v in variants:
                ratios = sorted(a / b for a, b in zip(results[v], results["ours"]))
                ratio = "" if v == "ours" else (f"  ours / {v}: {med[v] / med['ours']:.2f}x [{statistics.median(ratios):.2f}x,"
                                                f" repeats {ratios[0]:.2f}-{ratios[-1]:.2f}]")
                role = " (anchor)" if v == ANCHOR else ""
                print(f"  {v + role:<20}{G * PROMPTS / med[v]:7.1f} completions/s  [{precision[v]}]{ratio}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
