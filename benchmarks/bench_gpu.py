"""A 0.5B-class model on a GPU: our GRPO step vs TRL's GRPOTrainer with the same settings.

The model is Qwen2.5-0.5B's shape built from config (random init, nothing downloaded) with a tokenizer
covering its 151,936-token vocabulary; weights in bf16; G = 8 completions of each of 8 prompts, 256
new tokens (a random model never emits EOS, so every completion is 256 tokens long), LoRA r = 8 on all
projections, beta > 0, no gradient checkpointing for either. Four variants, each in a fresh process:
ours (the fused decode step, captured once per sampling call as a CUDA graph and replayed per token), ours
with that step launched op by op (`ours_eager`: what the graph saves), ours with HF's forward for every
token (`ours_exact`: what the fused step saves), and TRL (skipped, and said, where TRL is not installed).
First, `check`: the decoder's log-probabilities against HF's forward along its own trajectory, captured and
op by op (the contract tests/test_rollout.py holds on the CPU, where no graph is captured). Each of our variants
also prints the train/inference mismatch its last step recorded: our bf16 decoder against the bf16 trainer (vLLM
cannot run there: the GPU machine has no vLLM and its wheels cannot travel). After warm-up
steps, the median step time gives completions/s and completion tokens/s, and torch.cuda.max_memory_allocated
the peak. Built to finish within 8 minutes on one H100/H200-class GPU.

    pip install -e '.[bench]'
    python benchmarks/bench_gpu.py                 # needs CUDA
    python benchmarks/bench_gpu.py --smoke         # tiny shapes on the CPU: checks the script runs

It runs on an image's own torch and transformers without installing the package (whose torch range
would replace that torch): where `grpo_sentinel` is not importable, the workers import it from this
source tree. On this project's GPU machine (torch 2.11, transformers 5.17, no network), carry the
missing pure-Python packages as wheels (`benchmarks/gpu_wheels.sh` fetches them into .whl/) and run:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl && PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmarks/bench_gpu.py | tee $OUT/bench_gpu.log
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402

QWEN_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1_000_000.0,
                 tie_word_embeddings=True)
SMOKE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=512, tie_word_embeddings=True)
G, PROMPTS = 8, 8
VARIANTS = ["ours", "ours_eager", "ours_exact", "trl"]


def worker_ours(path: Path, max_new: int, steps: int, device: str, decoding: str = "graph") -> dict:
    import dataclasses
    import types

    import torch

    from grpo_sentinel.service.grpo import decoder, rollout, step

    if decoding == "exact":  # every new token through HF's forward, as before the fused decode step
        step.sample = functools.partial(rollout.sample, exact=True)
    elif decoding == "eager":  # the fused step, not captured
        of = decoder.Decoder.of
        rollout.Decoder = types.SimpleNamespace(of=lambda net: (d := of(net)) and dataclasses.replace(d, capture=None))
    run = common.ours(path, max_new, "model.dtype=bfloat16", f"model.device={device}", "grpo.micro_batch_size=64")
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        stats = run.next()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) == 2 and device == "cuda":  # peak of the measured steps, not of loading
            torch.cuda.reset_peak_memory_stats()
    # The train/inference mismatch of our own decoder (bf16, LoRA folded, the captured step) against the trainer's
    # bf16 forward of the same tokens: what the mismatch row reads on a GPU run without vLLM.
    return {"times": times, "tokens": float(stats.response_len) * G * PROMPTS, "peak": _peak(device),
            "mismatch": {k: getattr(stats, k) for k in ("mismatch_kl", "logp_diff_mean", "logp_diff_max")}}


def worker_check(path: Path, max_new: int, steps: int, device: str) -> dict:
    """The captured step's correctness on this device, before any timing: along its own trajectory, every
    token's log-probability against HF's forward over the finished sequences (tests/test_rollout.py's contract,
    which the CPU can only check by re-running the step), for the graph and for the step op by op, from one
    seed. bf16 rounds at ~4e-3 relative: a wrong mask or position is off by whole units."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_sentinel.service.data import read_jsonl
    from grpo_sentinel.service.grpo import lora
    from grpo_sentinel.service.grpo.decoder import Decoder
    from grpo_sentinel.service.grpo.rollout import SamplingDraw, decode, position_ids

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = common.trained_adapter(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(device))
    tokenizer.padding_side = "left"
    prompts = [e.prompt for e in read_jsonl(common.dataset())][:PROMPTS]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    row = torch.arange(PROMPTS, device=device).repeat_interleave(G)
    new = min(max_new, 64)  # the check's logits are [64 rows, tokens, V] per path: a few GB at V = 151,936
    out: dict = {}
    with torch.no_grad(), lora.folded(model) as net:
        step = Decoder.of(net)
        if step is None:
            return {"error": "the decoder declined the model"}
        for name, capture in (("graph", step.capture or (lambda fn: fn)), ("eager", None)):  # CPU: the re-run
            seen = []

            def draw(logits):
                seen.append(logits)
                return SamplingDraw(1.0, 1.0)(logits)

            torch.manual_seed(1)
            ids = decode(net, enc["input_ids"], enc["attention_mask"], row, new, draw=draw,
                         eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id,
                         step=dataclasses.replace(step, capture=capture))
            mask = torch.cat([enc["attention_mask"][row], torch.ones_like(ids)], 1)
            Lp, T = enc["input_ids"].shape[1], ids.shape[1]
            hf = net(input_ids=torch.cat([enc["input_ids"][row], ids], 1), attention_mask=mask,
                     position_ids=position_ids(mask)).logits[:, Lp - 1 : Lp + T - 1]
            diff = (torch.stack(seen, 1).log_softmax(-1) - hf.float().log_softmax(-1)).abs()
            out[name] = {"max_logprob_diff": diff.max().item(), "mean_logprob_diff": diff.mean().item(), "tokens": T,
                         "captured": capture is not None and capture is step.capture}
            out[f"{name}_ids"] = ids
    out["same_tokens"] = bool(torch.equal(out.pop("graph_ids"), out.pop("eager_ids")))
    return out


def worker_trl(path: Path, max_new: int, steps: int, device: str) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_sentinel.service.data import read_jsonl

    rows = [{"prompt": e.prompt, "answer": e.answer} for e in read_jsonl(common.dataset())]

    class Clock(TrainerCallback):
        times: list[float] = []

        def on_step_begin(self, *a, **k):
            _sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            _sync(device)
            self.times.append(time.perf_counter() - self.t0)
            if len(self.times) == 2 and device == "cuda":
                torch.cuda.reset_peak_memory_stats()

    with tempfile.TemporaryDirectory() as tmp:
        # bf16 weights as ours; TRL's bf16 autocast on top is its default and costs nothing on a GPU.
        args = GRPOConfig(output_dir=tmp, use_cpu=device == "cpu", per_device_train_batch_size=G * PROMPTS,
                          num_generations=G, max_completion_length=max_new, beta=common.BETA, learning_rate=common.LR,
                          loss_type="grpo", bf16=True, gradient_checkpointing=False,
                          model_init_kwargs={"dtype": "bfloat16"}, max_steps=steps, logging_steps=10_000,
                          save_strategy="no", report_to=[])
        clock = Clock()
        GRPOTrainer(model=str(path), reward_funcs=[zero_reward], args=args, train_dataset=Dataset.from_list(rows),
                    callbacks=[clock], peft_config=LoraConfig(r=common.RANK, lora_alpha=2 * common.RANK,
                                                              target_modules=common.TARGETS,
                                                              task_type="CAUSAL_LM")).train()
    return {"times": clock.times, "tokens": float(max_new * G * PROMPTS), "peak": _peak(device)}


def zero_reward(completions, **_):  # a random model is never right; the step's cost does not depend on it
    return [0.0] * len(completions)


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _peak(device: str) -> float:
    import torch

    return float(torch.cuda.max_memory_allocated()) if device == "cuda" else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true", help="tiny model, 16 tokens, on the CPU: the script runs end to end")
    ap.add_argument("--steps", type=int, help="steps per trainer, the first two are warm-up (default 5, smoke 3)")
    ap.add_argument("--worker", choices=["check", *VARIANTS])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--max-new", type=int)
    ap.add_argument("--device")
    args = ap.parse_args()
    if args.worker:
        fn = {"check": worker_check, "ours": worker_ours, "ours_eager": functools.partial(worker_ours, decoding="eager"),
              "ours_exact": functools.partial(worker_ours, decoding="exact"), "trl": worker_trl}
        print(json.dumps(fn[args.worker](args.model, args.max_new, args.steps, args.device)))
        return

    import torch

    if not args.smoke and not torch.cuda.is_available():
        sys.exit("bench_gpu.py: no CUDA device here (torch.cuda.is_available() is False). On a GPU node, run it on "
                 "the node's CUDA build of torch (README, Install); here, `--smoke` runs tiny shapes on the CPU.")
    device, shape, max_new = ("cpu", SMOKE, 16) if args.smoke else ("cuda", QWEN_0_5B, 256)
    steps = args.steps or (3 if args.smoke else 5)
    print(common.machine())
    import transformers

    print(f"transformers {transformers.__version__}; TRL: "
          f"{'installed' if importlib.util.find_spec('trl') else 'not installed, its line is skipped'}")
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        env = None  # the installed package, else this source tree
        if importlib.util.find_spec("grpo_sentinel") is None:
            env = common.source_env(Path(__file__).resolve().parents[1], Path(tmp) / "shim" / "grpo_sentinel")
            sys.path.insert(0, str(Path(tmp) / "shim"))
            print("grpo_sentinel: not installed, imported from this source tree")
        path = common.large_vocab_model(Path(tmp) / "qwen-0.5b-shape", dtype="bfloat16", **shape)
        print(f"model: Qwen2 {shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, V=151936, bf16; "
              f"G={G} x {PROMPTS} prompts, {max_new} new tokens, r={common.RANK}, beta={common.BETA}; "
              f"built in {time.perf_counter() - t_start:.0f} s", flush=True)
        check = subprocess.run([sys.executable, __file__, "--worker", "check", "--model", str(path), "--max-new",
                                str(max_new), "--steps", "0", "--device", device], capture_output=True, text=True, env=env)
        if check.returncode != 0:
            print(f"  check failed:\n{check.stderr[-3000:]}", flush=True)
        else:  # the decoder's own log-probabilities against HF's forward, along its trajectory (worker_check)
            c = json.loads(check.stdout.strip().splitlines()[-1])
            print("  check: " + (c["error"] if "error" in c else "; ".join(
                f"{k} ({'CUDA graph' if c[k]['captured'] else 'op by op' if k == 'eager' else 'no CUDA: re-run'}) "
                f"max |log-prob - HF's| "
                f"{c[k]['max_logprob_diff']:.3g}, mean {c[k]['mean_logprob_diff']:.2g} over {c[k]['tokens']} tokens"
                for k in ("graph", "eager")) + f"; the same tokens from one seed: {c['same_tokens']}"), flush=True)
        results = {}
        for variant in [v for v in VARIANTS if v != "trl" or importlib.util.find_spec("trl")]:
            out = subprocess.run([sys.executable, __file__, "--worker", variant, "--model", str(path), "--max-new",
                                  str(max_new), "--steps", str(steps), "--device", device], capture_output=True,
                                 text=True, env=env)
            if out.returncode != 0:  # one failed variant (TRL's imports on an image) does not lose the others
                print(f"  {variant} failed:\n{out.stderr[-3000:]}", flush=True)
                continue
            results[variant] = r = json.loads(out.stdout.strip().splitlines()[-1])
            sec = statistics.median(r["times"][2:] or r["times"])
            r["sec"] = sec
            peak = f"{r['peak'] / 2**30:.1f} GiB" if r["peak"] == r["peak"] else "n/a on CPU"
            print(f"  {variant:<10} {sec:6.2f} s/step  {G * PROMPTS / sec:7.1f} completions/s  "
                  f"{r['tokens'] / sec:8.0f} completion tokens/s  peak {peak}", flush=True)
            if "mismatch" in r:  # sampler (our decoder) vs trainer, bf16 both, the last step
                m = r["mismatch"]
                print(f"  {'':<10} mismatch KL {m['mismatch_kl']:.3g}, mean |log-prob gap| {m['logp_diff_mean']:.3g}, "
                      f"max {m['logp_diff_max']:.3g}", flush=True)
        for other in [v for v in results if v != "ours" and "ours" in results]:
            print(f"  ours / {other}: {results[other]['sec'] / results['ours']['sec']:.2f}x")
        print(f"  total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
