"""GRPO math as pure tensor functions. Shapes: P prompts, G completions each, B = P*G
sequences, T completion positions, V vocabulary. Masks are float {0, 1}.
"""

from __future__ import annotations

import torch

ADV_EPS = 1e-4  # added to the group std: a group whose rewards are all equal gets advantage 0, not 0/0


def group_advantages(rewards: torch.Tensor, valid: torch.Tensor, scale: bool = True) -> torch.Tensor:
    """A_i = (r_i - mean(r_group)) / (std(r_group) + 1e-4), std unbiased (n-1), over valid samples.

    rewards, valid: [P, G] (invalid rewards may be NaN). Returns [P, G]; invalid samples get 0.
    A population std (n) would give +-0.9998 for rewards [1,1,0,0] instead of +-0.8659.
    """
    r = torch.where(valid.bool(), rewards, torch.zeros_like(rewards))
    n = valid.sum(dim=1, keepdim=True)  # [P, 1]
    mean = r.sum(dim=1, keepdim=True) / n.clamp(min=1)
    centred = (r - mean) * valid
    adv = centred
    if scale:
        var = centred.pow(2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)
        adv = centred / (var.sqrt() + ADV_EPS)
    return adv * valid


CHUNK_ELEMENTS = 1 << 21  # float32 temporaries per chunk (8 MiB): a small part of a large-vocabulary logits tensor


def _time_chunks(logits: torch.Tensor, budget: int) -> list[slice]:
    """Slices of the T axis of logits [B, T, V] holding ~budget elements each (at least one position).
    Chunks along T are views even of a non-contiguous logits[:, :-1]; a small vocabulary is one chunk."""
    B, T, V = logits.shape
    step = max(1, budget // max(1, B * V))
    return [slice(t, t + step) for t in range(0, T, step)]


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0,
                   chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature), in float32. logits [B, T, V], tokens [B, T] -> [B, T].

    Differentiable, and chunked both ways: the forward keeps only the per-position logsumexp, the backward
    recomputes the softmax chunk by chunk, so beyond the logits (and, in the backward, their gradient) no
    [B, T, V] tensor is ever held: with V = 150k the float32 z = logits / T alone would be 2x bf16 logits.
    """
    return _TokenLogProbs.apply(logits, tokens, temperature, chunk_elements)


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, tokens, temperature, chunk_elements):
        out = torch.empty(tokens.shape, dtype=torch.float32, device=logits.device)  # [B, T]
        lse = torch.empty_like(out)
        for s in _time_chunks(logits, chunk_elements):
            z = logits[:, s].float() / temperature  # [B, t, V]
            lse[:, s] = torch.logsumexp(z, dim=-1)
            out[:, s] = z.gather(-1, tokens[:, s].unsqueeze(-1)).squeeze(-1) - lse[:, s]
        ctx.save_for_backward(logits, tokens, lse)
        ctx.temperature, ctx.chunk_elements = temperature, chunk_elements
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):  # grad [B, T]; d logp / d logits = (onehot(token) - softmax(z)) / temperature
        logits, tokens, lse = ctx.saved_tensors
        out = torch.empty_like(logits)
        for s in _time_chunks(logits, ctx.chunk_elements):
            g = grad[:, s].unsqueeze(-1)  # [B, t, 1]
            p = (logits[:, s].float() / ctx.temperature - lse[:, s].unsqueeze(-1)).exp_()  # softmax, [B, t, V]
            p.mul_(-g).scatter_add_(-1, tokens[:, s].unsqueeze(-1), g)
            out[:, s] = p.div_(ctx.temperature)
        return out, None, None, None


@torch.no_grad()
def token_entropy(logits: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS) -> torch.Tensor:
    """H = -sum_v p log p of the un-tempered float32 distribution. [B, T, V] -> [B, T].

    Chunks along T bound the float32 temporaries to ~chunk_elements, however long the batch.
    """
    out = torch.empty(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    for s in _time_chunks(logits, chunk_elements):
        logp = torch.log_softmax(logits[:, s].float(), dim=-1)
        out[:, s] = -(logp.exp() * logp).sum(-1)
    return out


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(d) - d - 1 with d = ref - logp; >= 0. [B, T]."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO-style clipped objective, negated as a per-token loss. logp, old_logp [B, T], adv [B].

    Returns (loss [B, T], clipped [B, T] as 0/1: the clip bound was the active one).
    """
    ratio = torch.exp(logp - old_logp)
    a = adv.unsqueeze(1)
    unclipped = ratio * a
    clipped = ratio.clamp(1 - eps_low, 1 + eps_high) * a
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def token_weights(mask: torch.Tensor, loss_type: str, max_new_tokens: int, n_seq: int | None = None,
                  n_tokens: torch.Tensor | None = None) -> torch.Tensor:
    """Weights w [B, T] such that the batch loss is sum(w * per_token_loss).

    grpo:    mean over each sequence's tokens, then over sequences (short answers weigh more per token)
    dapo:    mean over all tokens of the batch (every token weighs the same)
    dr_grpo: sum / (B * max_new_tokens): a constant normaliser, no length bias at all
    Computing the normaliser once over the whole batch keeps micro-batches exact; across ranks, pass
    the whole batch's sequence count `n_seq` and (dapo) token count `n_tokens`, and each rank's share
    sums to the one-process loss.
    """
    n_seq = mask.shape[0] if n_seq is None else n_seq
    if loss_type == "grpo":
        return mask / mask.sum(1, keepdim=True).clamp(min=1) / n_seq
    if loss_type == "dapo":
        return mask / (mask.sum() if n_tokens is None else n_tokens).clamp(min=1)
    if loss_type == "dr_grpo":
        return mask / (n_seq * max_new_tokens)
    raise ValueError(f"unknown loss_type {loss_type!r}")


def importance_weights(log_ratio: torch.Tensor, mask: torch.Tensor, mode: str, clip_min: float | None,
                       clip_max: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The train/inference importance-sampling correction, as TRL 1.16 defines it
    (trl/trainer/grpo_trainer.py, `_generate_and_score_completions`; grpo_config.py `vllm_importance_sampling_*`).

    log_ratio [B, T]: log p_trainer - log p_sampler of each sampled token (the trainer's log-prob at the weights
    that sampled it); mask [B, T]. token modes weigh each token by its ratio r_t = exp(log_ratio); sequence modes
    weigh every token of a sequence by the product of its tokens' ratios, exp(sum_t mask * log_ratio). truncate:
    min(max(r, clip_min), clip_max); mask: r where clip_min <= r <= clip_max, else 0 (a bound that is None does
    not bound). Returns (weights [B, T], changed [B, T]: the tokens whose weight the bounds truncated or masked),
    0 outside the mask; mode "none": weights 1 where masked, nothing changed.
    """
    if mode == "none":
        return mask.clone(), torch.zeros_like(mask, dtype=torch.bool)
    d = log_ratio * mask
    if mode.startswith("sequence"):
        d = d.sum(1, keepdim=True).expand_as(mask)  # [B, T]: the sequence's log-ratio on each of its tokens
    ratio = torch.exp(d)
    lo = torch.full_like(ratio, -torch.inf if clip_min is None else clip_min)
    hi = torch.full_like(ratio, torch.inf if clip_max is None else clip_max)
    outside = (ratio < lo) | (ratio > hi)
    weights = torch.where(outside, 0.0, ratio) if mode.endswith("mask") else torch.minimum(torch.maximum(ratio, lo), hi)
    return weights * mask, outside & mask.bool()


def mismatch_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(sampler || trainer) from tokens the sampler drew: r - log r - 1 with
    log r = log p_trainer - log p_sampler (prime-rl's `mismatch_kl`); >= 0. [B, T]. As expm1(d) - d, which
    keeps the d^2 / 2 of a tiny gap (~1e-7 between two float32 forwards) that exp(d) - d - 1 rounds away."""
    return (torch.expm1(log_ratio) - log_ratio).clamp_min(0)
