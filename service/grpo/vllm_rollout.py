"""Rollouts on vLLM (`rollout.backend: vllm`): the engine in its own process, the base model loaded once, the
policy's LoRA adapter handed over after every optimizer step.

- The engine is vLLM's own multiprocess engine (its default): the training process holds a small client; the
  model runs in `VLLM::EngineCore` / `VLLM::Worker` processes. Inside the training process vLLM was 5-10x slower
  on 2 cores and slowed the trainer's own torch (../shared/spec/ENVIRONMENT.md).
- The adapter goes over as files: peft's `save_pretrained` into the run directory, then a `LoRARequest` under a
  new integer id each time (vLLM caches adapters by id: the same id would serve the old weights), with
  `max_loras=1` so the engine keeps only the newest. It is never merged into the base.
- Each prompt's G completions come from one request with `SamplingParams(n=G, logprobs=0, seed=...)`: the seed
  is drawn from torch's generator, which the trainer seeds from (seed, step), so a resumed step samples what the
  uninterrupted run sampled; a request's n completions get seeds seed..seed+n-1, hence the stride of G.
  `logprobs_mode="processed_logprobs"`: each sampled token's log-prob after temperature and top-p, the
  distribution it was drawn from, as our decoder returns it (rollout.SamplingDraw) and TRL compares it.
- On a CPU vLLM binds its worker to one core (VLLM_CPU_OMP_THREADS_BIND): the last of the cores this process
  may use, which the trainer then leaves to it (cpu.CpuShare.spare_core, give_up), so their threads never spin
  against each other; its KV cache is `rollout.vllm.kv_cache_gib` (VLLM_CPU_KVCACHE_SPACE).
- Creating the engine sets variables in this process's environment (LD_PRELOAD of its libgomp, LOCAL_WORLD_SIZE,
  ...) that every later child would inherit: they are restored once it runs.

The stale-adapter hook (`GRPO_SENTINEL_TEST_SKIP_HANDOVER=STEP`: from that step on no adapter is handed over) is
how the tests make a sampler fall out of sync on purpose; the mismatch row must page it.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import torch

from grpo_sentinel.service.config import Config
from grpo_sentinel.service.grpo.rollout import Rollout

log = logging.getLogger(__name__)

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
SKIP_HANDOVER = "GRPO_SENTINEL_TEST_SKIP_HANDOVER"


class VLLMSampler:
    """rollout.Sampler on a vLLM engine serving the base model and the policy's newest adapter."""

    def __init__(self, cfg: Config, model_path: Path, tokenizer, adapters: Path, cpu_core: int | None):
        from vllm import LLM

        self.tokenizer, self.adapters, self.group_size = tokenizer, adapters, cfg.grpo.group_size
        shutil.rmtree(adapters, ignore_errors=True)  # a killed process's last hand-over: the engine starts afresh
        v = cfg.rollout.vllm
        env = {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        if cpu_core is not None:
            env.update(VLLM_CPU_KVCACHE_SPACE=f"{v.kv_cache_gib:g}", VLLM_CPU_OMP_THREADS_BIND=str(cpu_core))
        before = dict(os.environ)
        os.environ.update(env)
        try:
            self.llm = LLM(model=str(model_path), dtype=cfg.model.dtype if v.dtype == "auto" else v.dtype,
                           enable_lora=True, max_lora_rank=next(r for r in LORA_RANKS if r >= cfg.model.lora.r),
                           max_loras=1, enforce_eager=v.enforce_eager, gpu_memory_utilization=v.gpu_memory_utilization,
                           logprobs_mode="processed_logprobs", seed=cfg.run.seed)
        finally:  # what the engine set in our environment stays out of every process we start later
            os.environ.clear()
            os.environ.update(before)
        self.lora = None
        self._id = 0
        skip = os.environ.get(SKIP_HANDOVER)
        self._skip_from = int(skip) if skip else None

    def hand_over(self, model, step: int) -> None:
        """The policy's adapter as it is now (after `step`'s update) becomes what the engine samples with."""
        from vllm.lora.request import LoRARequest

        if self._skip_from is not None and step >= self._skip_from and self.lora is not None:
            return  # the test hook: a stale adapter on purpose
        folder = self.adapters / f"step-{step:08d}"
        model.save_pretrained(str(folder))
        self._id += 1
        old = self.lora
        self.lora = LoRARequest(f"policy-{step}", self._id, str(folder))
        if old is not None:  # the engine keeps only the newest (max_loras=1); its files may go
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def __call__(self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float) -> Rollout:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        G = self.group_size
        groups = prompts[::G]  # each group one request of n = G (a prompt drawn twice is two requests)
        base = int(torch.randint(0, 2**31 - 1, ()).item())  # from the trainer's seeded generator: reproducible
        ids = {p: self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in groups}
        params = [SamplingParams(n=G, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0,
                                 seed=base + i * G) for i in range(len(groups))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids[p]) for p in groups], params, lora_request=self.lora,
                                 use_tqdm=False)
        completions = [c for o in outs for c in o.outputs]  # group by group, G each: the trainer's order
        lp = [[d[t].logprob for t, d in zip(c.token_ids, c.logprobs)] for c in completions]
        return rollout_of(self.tokenizer, ids, [list(c.token_ids) for c in completions], lp, prompts)

    def close(self) -> None:
        """Stop the engine's processes now (they would stop with this one, after a few seconds)."""
        core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()


def rollout_of(tokenizer, prompt_ids: dict[str, list[int]], completions: list[list[int]], logprobs: list[list[float]],
               prompts: list[str]) -> Rollout:
    """A Rollout as rollout.sample builds one, from token lists: prompts [B] (their token ids by text) left-padded,
    completions [B] right-padded, EOS counted in the completion, `truncated` where no EOS came within the cap."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    distinct = list(prompt_ids)
    B, T, Lp = len(completions), max(1, max(len(c) for c in completions)), max(len(p) for p in prompt_ids.values())
    row = torch.tensor([distinct.index(p) for p in prompts])  # [B] sequence -> its distinct prompt
    prompt = torch.tensor([[pad] * (Lp - len(p)) + p for p in prompt_ids.values()])  # [P, Lp]
    prompt_mask = torch.tensor([[0] * (Lp - len(p)) + [1] * len(p) for p in prompt_ids.values()])
    completion = torch.full((B, T), pad, dtype=torch.long)
    mask = torch.zeros(B, T)
    lp = torch.zeros(B, T)
    for b, (c, logp) in enumerate(zip(completions, logprobs)):
        completion[b, : len(c)] = torch.tensor(c, dtype=torch.long)
        mask[b, : len(c)] = 1.0
        lp[b, : len(logp)] = torch.tensor(logp, dtype=torch.float32)
    truncated = torch.tensor([not (c and c[-1] == eos) for c in completions])
    return Rollout(input_ids=torch.cat([prompt[row], completion], 1),
                   attention_mask=torch.cat([prompt_mask[row], mask.long()], 1), completion_ids=completion,
                   completion_mask=mask, truncated=truncated,
                   texts=tokenizer.batch_decode(completion.masked_fill(mask == 0, pad), skip_special_tokens=True),
                   prompt_lengths=prompt_mask[row].sum(1), prompt_index=row, logprobs=lp * mask)
