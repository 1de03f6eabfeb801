"""Sampling completions: prompts in, a padded batch of token ids and masks out; and the forward pass
over such a batch that computes each group's shared prompt once.

A decode loop of our own instead of `model.generate`, for three measured savings (docs/benchmarks.md):
the LoRA deltas are folded into the weights while sampling (one matmul per projection instead of
three), each distinct prompt is prefilled once (a group's G completions share its prompt), and the
loop does no per-token work beyond the forward pass, the draw and the stop check. For Llama-family
models that forward pass is decoder.py's run (fused projections, attention as two batched matmuls, a
fraction of HF's ops per token), which computes the same logits to float precision. The draw itself is
generate()'s: the same logits processors (non-finite values removed, temperature, top-p; no top-k)
and the same softmax + multinomial draw on the same random stream, so equal logits give equal tokens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer
from transformers.generation.logits_process import (
    InfNanRemoveLogitsProcessor,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from grpo_sentinel.service.grpo import lora
from grpo_sentinel.service.grpo.decoder import Decoder


@dataclass(frozen=True)
class Rollout:
    input_ids: torch.Tensor  # [B, Lp + T] left-padded prompt, then the completion padded on the right
    attention_mask: torch.Tensor  # [B, Lp + T] 1 on real prompt tokens and completion tokens up to EOS
    completion_ids: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T] float; includes the EOS token
    truncated: torch.Tensor  # [B] bool: no EOS within max_new_tokens
    texts: list[str]  # decoded completions, special tokens dropped
    prompt_lengths: torch.Tensor  # [B] real (unpadded) prompt tokens
    prompt_index: torch.Tensor  # [B] which distinct prompt each sequence continues (a group's G share one)
    # [B, T] the sampler's log-prob of each completion token under the distribution it drew from (temperature and
    # top-p applied: vLLM's processed_logprobs), 0 after EOS; None for greedy decoding. The step compares it with
    # the trainer's: the train/inference mismatch.
    logprobs: torch.Tensor | None = None

    @property
    def lengths(self) -> torch.Tensor:  # [B] completion tokens, EOS included
        return self.completion_mask.sum(1)


class Sampler(Protocol):
    """A rollout backend: G completions of each prompt (repeated G times), with the sampler's log-probs."""

    def __call__(self, prompts: list[str], *, max_new_tokens: int, temperature: float, top_p: float) -> Rollout: ...


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
           top_p: float = 1.0, greedy: bool = False, exact: bool = False) -> Rollout:
    """One completion per prompt (repeat a prompt G times for a group). Decoding runs decoder.Decoder
    where it recognises the model, HF's forward otherwise or with `exact` (token for token generate()'s:
    the reference the tests compare the decoder with)."""
    index = {p: i for i, p in enumerate(dict.fromkeys(prompts))}  # distinct prompts: tokenised and prefilled once
    row = torch.tensor([index[p] for p in prompts], device=model.device)  # [B] sequence -> its prompt
    tokenizer.padding_side = "left"  # generation appends on the right, so prompts align there
    enc = tokenizer(list(index), return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    draw = greedy_draw if greedy else SamplingDraw(temperature, top_p)
    with lora.folded(model) as net:
        completion = decode(net, enc["input_ids"], enc["attention_mask"], row, max_new_tokens, draw=draw,
                            eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id,
                            step=None if exact else Decoder.of(net))
    prompt_ids, prompt_mask = enc["input_ids"][row], enc["attention_mask"][row]  # [B, Lp]
    is_eos = completion == tokenizer.eos_token_id
    # Tokens up to and including the first EOS are the completion; everything after is padding.
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    mask = (~after_eos).float()
    logprobs = None if greedy else torch.stack(draw.logprobs, 1)[:, : completion.shape[1]] * mask  # [B, T]
    return Rollout(
        input_ids=torch.cat([prompt_ids, completion], dim=1),
        attention_mask=torch.cat([prompt_mask, mask.long()], dim=1),
        completion_ids=completion,
        completion_mask=mask,
        truncated=~is_eos.any(1),
        texts=tokenizer.batch_decode(completion.masked_fill(after_eos, tokenizer.pad_token_id), skip_special_tokens=True),
        prompt_lengths=prompt_mask.sum(1),
        prompt_index=row,
        logprobs=logprobs,
    )


def completion_logits(model, roll: Rollout, c: slice) -> torch.Tensor:
    """Logits that predict each completion token of the sequences `c`: [b, T, V], differentiable.

    Sequences that continue the same prompt share its keys and values: the prompt (but its last token)
    runs once per distinct prompt, its cache is expanded to the rows, and the rest runs per sequence.
    On the demo the prompt is half of every sequence: this saves ~a quarter of the step's forward and
    backward FLOPs. Equal to one forward over the whole sequences to float rounding."""
    ids, mask = roll.input_ids[c], roll.attention_mask[c]
    pos = position_ids(mask)
    L, T = ids.shape[1], roll.completion_ids.shape[1]
    Lp = L - T
    distinct, row = torch.unique(roll.prompt_index[c], return_inverse=True)
    if len(distinct) == len(row) or Lp < 2:  # nothing shared: one pass, lm_head only where a completion token is next
        return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                     logits_to_keep=torch.arange(Lp - 1, L - 1, device=ids.device)).logits
    first = torch.full((len(distinct),), len(row), device=row.device)  # a representative row of each prompt
    first.scatter_reduce_(0, row, torch.arange(len(row), device=row.device), reduce="amin")
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[first, : Lp - 1], attention_mask=mask[first, : Lp - 1], position_ids=pos[first, : Lp - 1],
          **_with_cache(model, cache), logits_to_keep=1)
    cache.reorder_cache(row)  # [P, ...] -> [b, ...], differentiable: gradients flow back to the shared prompt
    return model(input_ids=ids[:, Lp - 1 : L - 1], attention_mask=mask, position_ids=pos[:, Lp - 1 : L - 1],
                 **_with_cache(model, cache)).logits


def decode(net, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, row: torch.Tensor, max_new_tokens: int, *,
           draw, eos: int, pad: int, step: Decoder | None = None) -> torch.Tensor:
    """Autoregressive decoding with a KV cache. prompt_ids, prompt_mask [P, Lp] (left-padded, distinct
    prompts); row [B] maps each sequence to its prompt. Returns the completions [B, T], T <= max_new_tokens
    (the loop stops once every sequence has emitted EOS), pad after each sequence's EOS. The prompts are
    prefilled by the model's forward; each new token goes through a run of `step` if given, else through it too.

    Positions and masks are generate()'s: a left-padded prompt's first real token has position 0, and a
    finished sequence keeps attending (its later tokens are padding nobody reads)."""
    B, Lp = len(row), prompt_ids.shape[1]
    mask = torch.cat([prompt_mask[row], prompt_mask.new_ones(B, max_new_tokens)], dim=1)  # [B, Lp + max_new_tokens]
    next_position = prompt_mask.sum(1, keepdim=True)[row]  # [B, 1]: the first new token follows the real prompt
    cache = _cache(net.config, Lp + max_new_tokens)
    logits = net(input_ids=prompt_ids, attention_mask=prompt_mask,
                 position_ids=(prompt_mask.cumsum(1) - 1).masked_fill(prompt_mask == 0, 1),
                 **_with_cache(net, cache), logits_to_keep=1).logits[:, -1]  # [P, V]
    if B != len(prompt_ids):  # G sequences per prompt from here on
        cache.reorder_cache(row)
        logits = logits[row]
    run = None
    if step is not None:  # the keys each row may attend to: every key when no prompt is padded
        run = step.begin(cache, next_position + torch.arange(max_new_tokens, device=row.device),
                         None if bool(prompt_mask.all()) else mask.bool())
    out = torch.full((B, max_new_tokens), pad, dtype=torch.long, device=prompt_ids.device)
    running = torch.ones(B, dtype=torch.bool, device=prompt_ids.device)
    for t in range(max_new_tokens):
        token = draw(logits.float()).masked_fill(~running, pad)  # [B]
        out[:, t] = token
        running &= token != eos
        if t + 1 == max_new_tokens or not running.any():
            return out[:, : t + 1]
        if run is not None:
            logits = run(token)
        else:
            logits = net(input_ids=token[:, None], attention_mask=mask[:, : Lp + t + 1], position_ids=next_position + t,
                         **_with_cache(net, cache)).logits[:, -1]
    return out


class _PreallocatedLayer(DynamicLayer):
    """A full-attention layer's cache sized for the whole generation: each token's keys and values are
    written in place, where DynamicLayer concatenates (copying the layer's whole cache once per token)."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:  # [b, heads, capacity, head_dim], filled up to self.length
            b, h = key_states.shape[:2]
            self.k = key_states.new_empty(b, h, self.capacity, key_states.shape[-1])
            self.v = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
            self.length, self.device, self.is_initialized = 0, key_states.device, True
        n = key_states.shape[-2]
        self.k[:, :, self.length : self.length + n] = key_states
        self.v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self.keys, self.values = self.k[:, :, : self.length], self.v[:, :, : self.length]
        return self.keys, self.values

    def reorder_cache(self, rows: torch.Tensor) -> None:
        """Row i becomes row rows[i]; only the filled positions are copied (a prompt fills a few of capacity)."""
        k, v = self.k.new_empty(len(rows), *self.k.shape[1:]), self.v.new_empty(len(rows), *self.v.shape[1:])
        torch.index_select(self.keys, 0, rows, out=k[:, :, : self.length])
        torch.index_select(self.values, 0, rows, out=v[:, :, : self.length])
        self.k, self.v = k, v
        self.keys, self.values = k[:, :, : self.length], v[:, :, : self.length]


def _cache(config, capacity: int) -> Cache:
    """Preallocated layers where every layer attends to all positions; HF's own cache otherwise
    (sliding-window and other layer kinds keep their own logic)."""
    config = config.get_text_config(decoder=True)
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    if set(kinds) != {"full_attention"}:
        return DynamicCache(config=config)
    return Cache(layers=[_PreallocatedLayer(capacity) for _ in kinds])


def _with_cache(model, cache: Cache) -> dict:
    """forward()'s keyword arguments that read and extend `cache`: transformers 5.24 names it `cache`, 5.17
    `past_key_values` (5.24 still takes the old name, deprecated until 5.40)."""
    net = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_keyword(type(net)): cache, "use_cache": True}


@lru_cache(maxsize=None)
def _cache_keyword(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def greedy_draw(logits: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B]: generate(do_sample=False, remove_invalid_values=True)."""
    return _finite(logits).argmax(-1)


class SamplingDraw:
    """generate(do_sample=True, temperature, top_p, top_k=0, remove_invalid_values=True)'s draw, processor
    for processor and in its order: non-finite logits must not crash sampling (the step's loss guard
    sees them again in the training forward pass and skips the update). It keeps each drawn token's
    log-probability under the distribution it was drawn from (`logprobs`, [B] a call): one gather and a log
    of the probabilities the draw computes anyway."""

    def __init__(self, temperature: float, top_p: float):
        self.warpers = []
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self.logprobs: list[torch.Tensor] = []

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B]
        logits = _finite(logits)
        for w in self.warpers:
            logits = w(None, logits)
        probs = torch.softmax(logits, dim=-1)
        token = _race(probs)
        self.logprobs.append(probs.gather(-1, token[:, None]).squeeze(-1).log())
        return token


def _race(probs: torch.Tensor) -> torch.Tensor:
    """[B, V] -> [B]: torch.multinomial(probs, 1)'s own algorithm (argmax of p / E, E ~ Exp(1): the exponential
    race), the same draws from the same random stream, without its validity checks: they read the tensor back
    to the host, two syncs a token on a GPU in the torch versions that still check synchronously (pytorch
    #108968). These probabilities are a softmax of finite logits, valid by construction. tests/test_rollout.py
    holds the draws to generate()'s, token for token."""
    return (probs / torch.empty_like(probs).exponential_(1)).argmax(-1)


def _finite(logits: torch.Tensor) -> torch.Tensor:
    """generate()'s InfNanRemoveLogitsProcessor. On the CPU skipped when every logit is finite: it is the
    identity then, and its three masked copies cost 7x a softmax over a 150k vocabulary (the check: one
    pass). On a GPU always applied: the check would wait for the device (a host sync a token, on top of the
    stop check's), and three elementwise kernels cost less than that wait."""
    if logits.is_cuda or not torch.isfinite(logits).all():
        return InfNanRemoveLogitsProcessor()(None, logits)
    return logits


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() used them. [B, L] -> [B, L]."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)
