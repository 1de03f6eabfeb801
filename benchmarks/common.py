"""What the speed benchmarks share: the two settings, the prompts, our step driven directly
(`grpo_step`, not the trainer's loop), and the machine facts that change a ratio.

Settings: "demo" is the embedded task (answers of a few tokens, max_new_tokens 6); "tok32" is
the same model with EOS remapped to a token it never emits, so every completion runs to 32 tokens.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

G, PROMPTS, RANK, BETA, LR = 8, 8, 8, 0.04, 1e-3
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SETTINGS = {"demo": 6, "tok32": 32}  # max_new_tokens


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


def dataset() -> Path:
    """The demo problems as JSONL with the prompt exactly as the model sees it ("12+34="), so both
    trainers tokenise the same text."""
    from grpo_sentinel.service.data import addition_examples

    path = Path(tempfile.gettempdir()) / "grpo-sentinel-bench-addition-v2.jsonl"
    if not path.exists():
        path.write_text("".join(json.dumps({"prompt": e.prompt, "answer": e.answer}) + "\n" for e in addition_examples()))
    return path


@dataclass
class Ours:
    """Our step, as the trainer drives it, minus the loop (evaluation, sinks, checkpoints)."""

    cfg: object
    policy: object
    scorer: object
    data: object
    sampler: object
    cursor: int = 0
    step: int = 0

    def next(self):
        import torch

        from grpo_sentinel.service.grpo.step import grpo_step
        from grpo_sentinel.service.trainer import step_seed

        self.step += 1
        torch.manual_seed(step_seed(self.cfg.run.seed, self.step))
        batch = [self.data.train[i] for i in self.sampler.batch(self.cursor, self.cfg.grpo.prompts_per_step)]
        self.cursor += len(batch)
        return grpo_step(self.policy, self.scorer, batch, self.cfg.grpo, self.step)


def ours(model: Path, max_new_tokens: int, *overrides: str, data: Path | None = None) -> Ours:
    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.data import BatchSampler, Verifier, load_datasets
    from grpo_sentinel.service.rewards import RewardScorer
    from grpo_sentinel.service.trainer import build_policy

    cfg = load_config(None, [f"model.path={model}", f"data.path={data or dataset()}", "data.eval_size=16",
                             f"grpo.max_new_tokens={max_new_tokens}", f"grpo.beta={BETA}", f"optim.lr={LR}",
                             f"model.lora.r={RANK}", f"model.lora.alpha={2 * RANK}", f"grpo.group_size={G}",
                             f"grpo.prompts_per_step={PROMPTS}", *overrides])
    data_ = load_datasets(cfg.data, cfg.run.seed)
    return Ours(cfg, build_policy(cfg), RewardScorer(cfg.rewards, Verifier(cfg.data.verifier), cfg.grpo), data_,
                BatchSampler(len(data_.train), cfg.run.seed))


def trained_adapter(base):
    """`base` with the benchmarks' LoRA (r = RANK on TARGETS) whose B is not zero, as after training (a fresh
    adapter's B is zero: sampling would not see it). Seeded: the same adapter every call."""
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model


def machine() -> str:
    """The facts that change a ratio: CPU model, native bf16 (else bf16 is emulated, ~8x slower),
    torch threads and version, GPU if any."""
    import torch

    flags, cpu = set(), platform.processor()
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
        flags = set(next(line for line in info.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        pass
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16"})
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return (f"CPU: {cpu}, {os.cpu_count()} cores; native bf16: {', '.join(bf16) if bf16 else 'no (emulated)'}; "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads; GPU: {gpu}")


def large_vocab_model(out: Path, vocab_size: int = 151_936, dtype: str = "float32", **config) -> Path:
    """A Qwen2 built from config (random init, nothing downloaded) with a Qwen-sized vocabulary, saved in
    `dtype` with a tokenizer that covers it: the demo's characters first, so the demo prompts tokenise as
    in the demo, then filler tokens. `config` overrides the (tiny) default shape."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    from grpo_sentinel.service.demo import build_tokenizer

    if (out / "config.json").exists():
        return out
    vocab = dict(build_tokenizer().get_vocab())
    vocab.update({f"<t{i}>": i for i in range(len(vocab), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=True) | config
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, pad_token_id=tokenizer.pad_token_id,
                                         eos_token_id=tokenizer.eos_token_id, bos_token_id=None, **shape))
    model.to(getattr(torch, dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def peak_reset() -> int:
    """Reset this process's resident-memory high-water mark (Linux >= 4.0) and return the resident bytes now.
    torch's CPU allocations are invisible to tracemalloc; the kernel's peak RSS sees them all (an upper
    bound on the live bytes: the allocator may keep freed pages)."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS") * 1024


def peak_since_reset(rss_at_reset: int) -> int:
    """Peak resident bytes above the resident bytes at the last peak_reset()."""
    return _status_kib("VmHWM") * 1024 - rss_at_reset


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def code_at(rev: str, tmp: Path) -> dict[str, str]:
    """The environment in which `grpo_sentinel` imports as it was at git revision `rev` (for before/after
    runs): service/ and telemetry/ of that revision, extracted under tmp, first on PYTHONPATH."""
    import subprocess

    repo = Path(__file__).resolve().parents[1]
    src, shim = tmp / f"src-{rev}", tmp / f"shim-{rev}" / "grpo_sentinel"
    src.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "service", "telemetry"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    return source_env(src, shim)


def source_env(src: Path, shim: Path) -> dict[str, str]:
    """The environment in which `grpo_sentinel` imports from the source tree `src` without being installed
    (a GPU image whose own torch the package's range would replace): `shim` links its service/ and telemetry/."""
    shim.mkdir(parents=True, exist_ok=True)
    for package in ("service", "telemetry"):
        link = shim / package
        if not link.exists():
            link.symlink_to(src / package)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim.parent), os.environ.get("PYTHONPATH", "")])}
