"""Throughput against the anchor: our GRPO step vs TRL's GRPOTrainer on the same tiny model.

Same model directory, G, prompts per step, max_new_tokens, LoRA rank, beta > 0, loss type, on
CPU. Variants run interleaved (ours, TRL defaults, TRL without gradient checkpointing), each in a
fresh process, `--repeats` times; the median step time after two warm-up steps gives
completions/s. Two settings: the demo task (answers of a few tokens), and 32-token completions
with EOS ignored (a copy of the model whose EOS token is one it never emits).

    pip install -e '.[bench]'
    python benchmarks/bench_vs_trl.py [--repeats 3] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

G, PROMPTS, RANK, BETA, LR = 8, 8, 8, 0.04, 1e-3
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SETTINGS = {"demo": 6, "tok32": 32}  # max_new_tokens
VARIANTS = ["ours", "trl_default", "trl_no_ckpt"]


def model_dir(setting: str, tmp: Path) -> Path:
    from grpo_sentinel.service.demo import demo_model_dir

    src = demo_model_dir()
    if setting == "demo":
        return src
    dst = tmp / "tok32"
    if not dst.exists():  # EOS -> <unk>, which the model never produces: every completion runs to the cap
        shutil.copytree(src, dst)
        for name in ("tokenizer_config.json", "config.json", "generation_config.json"):
            p = dst / name
            if p.exists():
                d = json.loads(p.read_text())
                if "eos_token" in d:
                    d["eos_token"] = "<unk>"
                if "eos_token_id" in d:
                    d["eos_token_id"] = 2
                if "max_position_embeddings" in d:
                    d["max_position_embeddings"] = 64
                p.write_text(json.dumps(d))
    return dst


def worker_ours(path: Path, max_new: int, steps: int) -> list[float]:
    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.trainer import Trainer, build_policy

    cfg = load_config(None, [f"model.path={path}", "data.path=" + str(_dataset()), "data.eval_size=16",
                             f"grpo.max_new_tokens={max_new}", f"grpo.beta={BETA}", f"optim.lr={LR}",
                             f"model.lora.r={RANK}", f"grpo.group_size={G}", f"grpo.prompts_per_step={PROMPTS}"],
                      **{"run.steps": steps})
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(cfg, Path(tmp))
        t.policy = build_policy(cfg)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            t._train_one()
            times.append(time.perf_counter() - t0)
    return times


def worker_trl(path: Path, max_new: int, steps: int, checkpointing: bool | None) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_sentinel.service.data import Verifier, read_jsonl

    verifier = Verifier("exact")
    rows = [{"prompt": e.prompt + "=", "answer": e.answer} for e in read_jsonl(_dataset())]

    def correct(prompts, completions, answer, **_):
        return [float(verifier.is_correct(c, a)) for c, a in zip(completions, answer)]

    class Clock(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, *a, **k):
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            self.times.append(time.perf_counter() - self.t0)

    extra = {} if checkpointing is None else {"gradient_checkpointing": checkpointing}
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, use_cpu=True, per_device_train_batch_size=G * PROMPTS, num_generations=G,
                          max_completion_length=max_new, beta=BETA, learning_rate=LR, loss_type="grpo",
                          max_steps=steps, logging_steps=10_000, save_strategy="no", report_to=[], **extra)
        clock = Clock()
        trainer = GRPOTrainer(model=str(path), reward_funcs=[correct], args=args, train_dataset=Dataset.from_list(rows),
                              peft_config=LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS,
                                                     task_type="CAUSAL_LM"), callbacks=[clock])
        trainer.train()
    return clock.times


def _dataset() -> Path:
    """The demo problems as a JSONL file, so both trainers read the same prompts."""
    from grpo_sentinel.service.demo import addition_examples

    path = Path(tempfile.gettempdir()) / "grpo-sentinel-bench-addition.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({"prompt": e.prompt.rstrip("="), "answer": e.answer}) + "\n"
                                for e in addition_examples()))
    return path


def measure(variant: str, setting: str, steps: int, tmp: Path) -> float:
    """Median step seconds of one fresh process, after two warm-up steps."""
    out = subprocess.run([sys.executable, __file__, "--worker", variant, "--setting", setting, "--steps", str(steps),
                          "--tmp", str(tmp)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{variant}/{setting} failed:\n{out.stderr[-3000:]}")
    times = json.loads(out.stdout.strip().splitlines()[-1])
    return statistics.median(times[2:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--worker", choices=VARIANTS)
    ap.add_argument("--setting", choices=list(SETTINGS))
    ap.add_argument("--tmp", type=Path)
    args = ap.parse_args()
    if args.worker:
        path = model_dir(args.setting, args.tmp)
        max_new = SETTINGS[args.setting]
        if args.worker == "ours":
            times = worker_ours(path, max_new, args.steps)
        else:
            times = worker_trl(path, max_new, args.steps, None if args.worker == "trl_default" else False)
        print(json.dumps(times))
        return
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            results = {v: [] for v in VARIANTS}
            for r in range(args.repeats):
                for v in VARIANTS:  # interleaved: drift on a noisy machine hits every variant alike
                    results[v].append(measure(v, setting, args.steps, Path(tmp)))
                    print(f"  {setting} repeat {r + 1} {v}: {G * PROMPTS / results[v][-1]:.1f} completions/s", flush=True)
            med = {v: statistics.median(t) for v, t in results.items()}
            print(f"{setting} (max_new_tokens={SETTINGS[setting]}, G={G}, prompts={PROMPTS}, r={RANK}, beta={BETA}): "
                  + ", ".join(f"{v} {G * PROMPTS / med[v]:.1f}/s" for v in VARIANTS))
            for v in VARIANTS[1:]:
                print(f"  ours / {v}: {med[v] / med['ours']:.2f}x")


if __name__ == "__main__":
    main()
