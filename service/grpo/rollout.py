"""Sampling completions: prompts in, a padded batch of token ids and masks out."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Rollout:
    input_ids: torch.Tensor  # [B, Lp + T] left-padded prompt, then the completion padded on the right
    attention_mask: torch.Tensor  # [B, Lp + T] 1 on real prompt tokens and completion tokens up to EOS
    completion_ids: torch.Tensor  # [B, T]
    completion_mask: torch.Tensor  # [B, T] float; includes the EOS token
    truncated: torch.Tensor  # [B] bool: no EOS within max_new_tokens
    texts: list[str]  # decoded completions, special tokens dropped

    @property
    def lengths(self) -> torch.Tensor:  # [B] completion tokens, EOS included
        return self.completion_mask.sum(1)


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, max_new_tokens: int, temperature: float = 1.0,
           top_p: float = 1.0, greedy: bool = False) -> Rollout:
    """One completion per prompt (repeat a prompt G times for a group)."""
    tokenizer.padding_side = "left"  # generation appends on the right, so prompts align there
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    sampling = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    # remove_invalid_values: non-finite logits must not crash sampling; the step's loss guard sees
    # them again in the training forward pass and skips the update.
    out = model.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id, remove_invalid_values=True, **sampling)
    prompt_len = enc["input_ids"].shape[1]
    completion = out[:, prompt_len:]
    is_eos = completion == tokenizer.eos_token_id
    # Tokens up to and including the first EOS are the completion; everything after is padding.
    after_eos = (is_eos.cumsum(1) - is_eos.long()) > 0
    mask = (~after_eos).float()
    return Rollout(
        input_ids=out,
        attention_mask=torch.cat([enc["attention_mask"], mask.long()], dim=1),
        completion_ids=completion,
        completion_mask=mask,
        truncated=~is_eos.any(1),
        texts=tokenizer.batch_decode(completion.masked_fill(after_eos, tokenizer.pad_token_id), skip_special_tokens=True),
    )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as generate() used them. [B, L] -> [B, L]."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)
