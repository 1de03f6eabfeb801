"""Peak memory on a large-vocabulary model built from config (Qwen2 shape, V = 151,936).

1. The log-prob + entropy computation on one sequence's completion logits (T = 512): its peak above the
   logits tensor itself, as a multiple of the logits' size (target: the whole stays within 1.25x, i.e.
   at most 0.25x on top), for our chunked functions and for the unchunked formula they replaced. The
   backward (to the logits) is shown too: it must hold the logits' gradient, 1x, whatever the method.
2. A training step (G = 8 completions of 256 tokens, one prompt, beta > 0, fp32, no checkpointing):
   our grpo_step against TRL's GRPOTrainer with the same settings, peak above the memory held before
   the step.

Method: each measurement runs in a fresh process. On CPU, torch's allocations are invisible to
tracemalloc, so the kernel's resident-memory high-water mark is reset (/proc/self/clear_refs) just
before the measured region and read after it (VmHWM - VmRSS at the reset): an upper bound on the live
bytes, since the allocator may keep freed pages. On a GPU, torch.cuda.max_memory_allocated is exact.

    python benchmarks/bench_memory.py [--steps 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

T_LOGITS, T_STEP, G = 512, 256, 8


class Peak:
    """Peak bytes allocated inside a `with` block, above what was held at its start."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = common.peak_reset()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.start
        else:
            self.bytes = common.peak_since_reset(self.start)


def worker_logprobs(model_dir: Path, method: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_sentinel.service.grpo import math as gm

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
    ids = torch.randint(15, model.config.vocab_size, (1, 8 + T_LOGITS), device=device)
    # The step's logits: the positions that predict the completion, through a head with trainable inputs.
    hidden = model.model(input_ids=ids).last_hidden_state[:, -(T_LOGITS + 1) : -1].detach().requires_grad_()
    logits = model.lm_head(hidden)  # [1, T, V]
    tokens = ids[:, -T_LOGITS:]
    size = logits.numel() * logits.element_size()
    with Peak(device) as fwd:
        if method == "chunked":
            logp = gm.token_logprobs(logits, tokens, 1.0)
            entropy = gm.token_entropy(logits)
        else:  # the code before: z = logits / T held for the backward, entropy in chunks of 1024 positions
            z = logits.float() / 1.0
            logp = z.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)
            with torch.no_grad():
                flat = logits.reshape(-1, logits.shape[-1])
                entropy = torch.empty(flat.shape[0], device=device)
                for i in range(0, flat.shape[0], 1024):
                    lp = torch.log_softmax(flat[i : i + 1024].float(), dim=-1)
                    entropy[i : i + 1024] = -(lp.exp() * lp).sum(-1)
    with Peak(device) as bwd:
        (grad,) = torch.autograd.grad(logp.sum(), logits)
    assert torch.isfinite(entropy).all() and torch.isfinite(grad).all()
    return {"logits_bytes": size, "forward": fwd.bytes, "backward": bwd.bytes, "dtype": str(dtype)}


def worker_step_ours(model_dir: Path, steps: int) -> dict:
    run = common.ours(model_dir, T_STEP, "grpo.prompts_per_step=1", f"grpo.group_size={G}")
    peaks = []
    for _ in range(steps):
        with Peak("cpu") as p:
            run.next()
        peaks.append(p.bytes)
    return {"peaks": peaks}


def worker_step_trl(model_dir: Path, steps: int) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [{"prompt": e.prompt, "answer": e.answer} for e in _rows()]

    class Meter(TrainerCallback):
        peaks: list[int] = []

        def on_step_begin(self, *a, **k):
            self.start = common.peak_reset()

        def on_step_end(self, *a, **k):
            self.peaks.append(common.peak_since_reset(self.start))

    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(output_dir=tmp, use_cpu=True, per_device_train_batch_size=G, num_generations=G,
                          max_completion_length=T_STEP, beta=common.BETA, learning_rate=common.LR, loss_type="grpo",
                          bf16=False, gradient_checkpointing=False, max_steps=steps, logging_steps=10_000,
                          save_strategy="no", report_to=[])
        meter = Meter()
        GRPOTrainer(model=str(model_dir), reward_funcs=[zero_reward], args=args,
                    train_dataset=Dataset.from_list(rows), callbacks=[meter],
                    peft_config=LoraConfig(r=common.RANK, lora_alpha=2 * common.RANK, target_modules=common.TARGETS,
                                           task_type="CAUSAL_LM")).train()
    return {"peaks": meter.peaks}


def zero_reward(completions, **_):  # a random model is never right; memory does not depend on the reward
    return [0.0] * len(completions)


def _rows():
    from grpo_sentinel.service.data import read_jsonl

    return read_jsonl(common.dataset())


def spawn(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3, help="training steps per trainer (the first is a warm-up)")
    ap.add_argument("--worker", choices=["chunked", "unchunked", "step_ours", "step_trl"])
    ap.add_argument("--model", type=Path)
    args = ap.parse_args()
    if args.worker:
        if args.worker in ("chunked", "unchunked"):
            res = worker_logprobs(args.model, args.worker)
        else:
            res = (worker_step_ours if args.worker == "step_ours" else worker_step_trl)(args.model, args.steps)
        print(json.dumps(res))
        return
    print(common.machine())
    mib = 2**20
    with tempfile.TemporaryDirectory() as tmp:
        model = common.large_vocab_model(Path(tmp) / "large-vocab")
        print(f"\n1. log-prob + entropy, one sequence, T={T_LOGITS}, V=151936 (peak above the logits):")
        for method in ("chunked", "unchunked"):
            r = spawn("--worker", method, "--model", str(model))
            size = r["logits_bytes"]
            print(f"  {method:<10} logits {size / mib:6.0f} MiB ({r['dtype']}); forward +{r['forward'] / mib:6.0f} MiB "
                  f"= {1 + r['forward'] / size:.2f}x the logits; backward to the logits +{r['backward'] / mib:6.0f} MiB "
                  f"({r['backward'] / size:.2f}x: the gradient itself is 1x)")
        print(f"\n2. training step, G={G} x {T_STEP} tokens, 1 prompt, beta={common.BETA}, fp32, no checkpointing "
              f"(peak above the memory held before the step, steps 2..{args.steps}):")
        for name, worker in (("ours", "step_ours"), ("TRL", "step_trl")):
            t0 = time.perf_counter()
            peaks = spawn("--worker", worker, "--model", str(model), "--steps", str(args.steps))["peaks"]
            print(f"  {name:<5} +{max(peaks[1:]) / mib:6.0f} MiB  (each step: "
                  f"{', '.join(f'{p / mib:.0f}' for p in peaks)} MiB; {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
