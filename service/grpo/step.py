"""One GRPO step: rollout -> reward -> advantage -> loss -> guarded update -> StepStats."""

from __future__ import annotations

import math
import resource
import time
from collections import Counter
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from grpo_sentinel.service.config import GRPOSettings
from grpo_sentinel.service.data import Example
from grpo_sentinel.service.distributed import SINGLE, Dist
from grpo_sentinel.service.grpo import lora
from grpo_sentinel.service.grpo import math as gm
from grpo_sentinel.service.grpo.rollout import Rollout, Sampler, completion_logits, sample
from grpo_sentinel.service.rewards import RewardScorer, Scores
from grpo_sentinel.telemetry.schema import RankStats, Samples, StepStats
from grpo_sentinel.telemetry.stats import repetition_rate


@dataclass
class Policy:
    """The trainable state of a run: a peft-wrapped model and what updates it."""

    model: torch.nn.Module  # PeftModel; adapter disabled = the reference
    tokenizer: object
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    max_grad_norm: float

    @property
    def trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @property
    def device(self) -> torch.device:
        return self.model.device


@dataclass(frozen=True)
class Part:
    """One rank's share of a step, host-side, gathered to rank 0 (B = this rank's sequences)."""

    scores: Scores
    per_seq: np.ndarray  # [5, B]: advantage, length, truncated, KL sum, entropy sum
    texts: dict  # prompts, answers [P]; completions [B]; prompt_tokens [P]
    clipped: tuple[float, float]  # (clipped loss tokens, loss tokens)
    rank: RankStats
    mismatch: np.ndarray | None  # [8] (mismatch_sums), None when no pass measured it (a skipped step)
    gaps: np.ndarray  # [tokens] |log p_trainer - log p_sampler| of this rank's completion tokens


def mismatch_sums(gap: torch.Tensor, tokens: torch.Tensor, changed: torch.Tensor) -> np.ndarray:
    """What rank 0 needs of one rank's train/inference mismatch, to combine over ranks exactly: gap [B, T] the
    log-ratio p_trainer / p_sampler of each token, tokens [B, T] bool, changed [B, T] bool (the correction's).
    -> [8]: tokens, sum k3, sum |gap|, max |gap|, min r, max r, sum r, tokens changed (r = exp(gap))."""
    d = gap[tokens].double()  # a gap of ~1e-7 has a k3 of ~1e-14: below float32's resolution of 1 + d
    if not d.numel():
        return np.array([0.0, 0.0, 0.0, -np.inf, np.inf, -np.inf, 0.0, 0.0])
    r = torch.exp(d)
    return torch.stack([torch.tensor(float(d.numel())), gm.mismatch_k3(d).sum(), d.abs().sum(), d.abs().max(), r.min(),
                        r.max(), r.sum(), changed[tokens].sum().float()]).double().cpu().numpy()


def grpo_step(policy: Policy, scorer: RewardScorer, examples: list[Example], cfg: GRPOSettings, step: int,
              dist: Dist = SINGLE, sampler: Sampler | None = None) -> StepStats | None:
    """One GRPO step on this rank's prompts (every prompt's whole group). Rank 0 returns the step's
    statistics over every rank's samples; the other ranks, None. `sampler`: the rollout backend (vLLM's
    engine); by default our decoder on the policy itself."""
    t0 = time.perf_counter()
    model, G = policy.model, cfg.group_size
    prompts = [e.prompt for e in examples for _ in range(G)]
    answers = [e.answer for e in examples for _ in range(G)]

    # 1. Rollout: G samples per prompt from the current policy, with the sampler's log-prob of each token.
    model.eval()
    roll = (sampler or partial(sample, model, policy.tokenizer))(
        prompts, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p)

    # 2. Rewards, one call per completion and function (see rewards.py for the invalid-value contract).
    scores = scorer.score(roll.texts, answers, prompts)
    dev = roll.completion_mask.device
    valid = torch.as_tensor(scores.valid, device=dev).float()  # [B]
    rewards = torch.as_tensor(scores.reward, device=dev, dtype=torch.float32)  # [B], NaN where invalid

    # 3. Advantages within each group (a group never spans ranks). Excluded samples get 0 and no loss weight.
    adv = gm.group_advantages(rewards.view(-1, G), valid.view(-1, G), scale=cfg.scale_rewards == "group").view(-1)
    mask = roll.completion_mask * valid.unsqueeze(1)  # [B, T] tokens that carry loss
    # The loss normalisers span the whole batch, every rank's: N ranks compute the loss and gradient
    # of one process over the same samples.
    weights = gm.token_weights(mask, cfg.loss_type, cfg.max_new_tokens, n_seq=len(prompts) * dist.world,
                               n_tokens=dist.sum(mask.sum()))  # [B, T]

    # 4. Reference log-probs: the same weights with the adapter switched off (beta = 0: not needed).
    chunks = [slice(i, i + cfg.micro_batch_size) for i in range(0, len(prompts), cfg.micro_batch_size)]
    ref_logp = _reference_logprobs(model, roll, chunks, cfg.temperature) if cfg.beta > 0 else None

    # 5. Loss and update: mu passes over the same samples, micro-batched; the first pass fixes old_logp, and
    # with it the train/inference mismatch: the trainer's log-prob of each sampled token against the sampler's.
    model.train()
    old_logp = {}
    kl_tok = torch.zeros_like(mask)  # [B, T]
    ent_tok = torch.zeros_like(mask)
    clipped_tok = torch.zeros_like(mask)
    tokens = roll.completion_mask.bool()  # [B, T] every completion token, scored or not: the sampler drew them all
    gap = torch.zeros_like(mask)  # [B, T] log p_trainer - log p_sampler
    is_w = torch.ones_like(mask)  # [B, T] the importance-sampling correction's weights (grpo.is_correction)
    changed = torch.zeros_like(tokens)  # [B, T] ... the tokens it truncated or masked
    losses = []
    skipped = "" if dist.any(bool(valid.any()), dev) else "no_scored_samples"  # every rank runs the same passes
    for it in range(cfg.mu if not skipped else 0):
        policy.optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=dev)
        for c in chunks:
            logits = _completion_logits(model, roll, c)  # [b, T, V]
            logp = gm.token_logprobs(logits, roll.completion_ids[c], cfg.temperature)  # [b, T]
            if it == 0:
                old_logp[c.start] = logp.detach()
                ent_tok[c] = gm.token_entropy(logits)
                gap[c] = (logp.detach() - roll.logprobs[c]) * roll.completion_mask[c]
                is_w[c], changed[c] = gm.importance_weights(gap[c], roll.completion_mask[c], cfg.is_correction,
                                                            cfg.is_clip_min, cfg.is_clip_max)
            per_token, clipped = gm.clipped_surrogate(logp, old_logp[c.start], adv[c], cfg.eps_low, cfg.eps_high)
            if cfg.is_correction != "none":  # after the clip, before the KL term: as TRL weighs it
                per_token = per_token * is_w[c]
            if ref_logp is not None:
                kl = gm.k3_kl(logp, ref_logp[c])
                per_token = per_token + cfg.beta * kl
                kl_tok[c] = kl.detach()
            chunk_loss = (weights[c] * per_token).sum()
            chunk_loss.backward()
            loss += chunk_loss.detach()
            clipped_tok[c] = torch.maximum(clipped_tok[c], clipped)
        # The weights normalise by the whole batch, so each rank's gradient is its share of the sum: one
        # all-reduce per update (none on inner micro-batches) makes it the whole batch's on every rank.
        dist.sum_grads(policy.trainable)
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.trainable, policy.max_grad_norm)  # the same on every rank
        loss = dist.sum(loss)  # the whole batch's loss
        losses.append(loss)
        # The guard, decided on every rank together: a non-finite loss or gradient anywhere never
        # reaches the weights (or Adam's moments), and the adapter stays identical on every rank.
        if dist.any(not torch.isfinite(loss + grad_norm).item(), dev):
            policy.optimizer.zero_grad(set_to_none=True)
            skipped = "nonfinite"
            break
        policy.optimizer.step()
    lr = policy.scheduler.get_last_lr()[0]
    policy.scheduler.step()

    # 6. Statistics: one device -> host transfer, then plain numpy; every rank's share gathered to rank 0,
    # which computes them over the whole batch (never a mean of per-rank means).
    per_seq = torch.stack([adv, roll.lengths, roll.truncated.float(), (kl_tok * roll.completion_mask).sum(1),
                           (ent_tok * roll.completion_mask).sum(1)]).cpu().numpy()
    host_loss = torch.stack(losses).mean().item() if losses else math.nan
    host_grad = grad_norm.item() if losses else math.nan
    # The texts behind the numbers, for traces: prompts and answers per group, completions per sample.
    prompt_len = roll.input_ids.shape[1] - roll.completion_ids.shape[1]
    texts = dict(prompts=tuple(e.prompt for e in examples), answers=tuple(e.answer for e in examples),
                 completions=tuple(roll.texts), prompt_tokens=roll.attention_mask[::G, :prompt_len].sum(1).cpu().numpy())
    clipped = (float((clipped_tok * mask).sum()), float(mask.sum()))
    own = RankStats(dist.rank, time.perf_counter() - t0, dist.take_wait(), peak_memory(dev))
    mismatch = mismatch_sums(gap, tokens, changed) if losses else None
    parts = dist.gather(Part(scores, per_seq, texts, clipped, own, mismatch, gap[tokens].abs().cpu().numpy()))
    if parts is None:
        return None
    whole = merge(parts)
    return _stats(step, whole, G, cfg, policy.model, host_loss, host_grad, lr, time.perf_counter() - t0, skipped,
                  tuple(p.rank for p in parts))


def merge(parts: list[Part]) -> Part:
    """The ranks' shares, in rank order: the whole batch as one process would have held it."""
    s = [p.scores for p in parts]
    scores = Scores(reward=np.concatenate([x.reward for x in s]),
                    components={k: np.concatenate([x.components[k] for x in s]) for k in s[0].components},
                    correct=np.concatenate([x.correct for x in s]), valid=np.concatenate([x.valid for x in s]),
                    invalid=sum((x.invalid for x in s), Counter()))
    t = [p.texts for p in parts]
    texts = {k: sum((x[k] for x in t), ()) for k in ("prompts", "answers", "completions")}
    texts["prompt_tokens"] = np.concatenate([x["prompt_tokens"] for x in t])
    m = np.stack([p.mismatch for p in parts]) if all(p.mismatch is not None for p in parts) else None
    mismatch = None if m is None else np.array([*m[:, :3].sum(0), m[:, 3].max(), m[:, 4].min(), m[:, 5].max(),
                                                *m[:, 6:].sum(0)])  # sums add, maxima max, minima min
    return Part(scores, np.concatenate([p.per_seq for p in parts], axis=1), texts,
                (sum(p.clipped[0] for p in parts), sum(p.clipped[1] for p in parts)), parts[0].rank, mismatch,
                np.concatenate([p.gaps for p in parts]))


def peak_memory(device: torch.device) -> float:
    """Bytes: the CUDA allocator's peak, else this process's peak resident set."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)  # Linux reports KiB


@torch.no_grad()
def _reference_logprobs(model, roll: Rollout, chunks: list[slice], temperature: float) -> torch.Tensor:
    """[B, T] log-probs under the base model: the LoRA layers swapped for their base layers, which is
    cheaper than toggling peft's adapter state (~3 ms a step here; its disable_adapter() context ~12 ms)."""
    with lora.off(model):
        return torch.cat([gm.token_logprobs(_completion_logits(model, roll, c), roll.completion_ids[c], temperature)
                          for c in chunks])


def _completion_logits(model, roll: Rollout, c: slice) -> torch.Tensor:
    """Logits that predict each completion token: [b, T, V], each group's prompt computed once (rollout.py)."""
    with lora.fused(model):  # one autograd node per LoRA projection instead of peft's five (see lora.py)
        return completion_logits(model, roll, c)


def _stats(step: int, whole: Part, G: int, cfg: GRPOSettings, model, loss: float, grad_norm: float, lr: float,
           seconds: float, skipped: str, ranks: tuple[RankStats, ...] = ()) -> StepStats:
    scores, texts = whole.scores, whole.texts
    adv, length, truncated, kl_sum, ent_sum = whole.per_seq
    valid, correct, reward = scores.valid, scores.correct, scores.reward
    clip_frac = whole.clipped[0] / max(whole.clipped[1], 1.0)
    # Groups: zero std = no learning signal (fewer than 2 valid samples carries none either).
    grouped = reward.reshape(-1, G)
    group_std = np.array([np.std(g[~np.isnan(g)], ddof=1) if (~np.isnan(g)).sum() > 1 else 0.0 for g in grouped])
    zero = group_std == 0
    corr_g = correct.reshape(-1, G)
    n_tok = max(length.sum(), 1.0)
    vocab = model.get_output_embeddings().weight.shape[0]
    entropy = ent_sum.sum() / n_tok
    return StepStats(
        step=step,
        reward=float(np.nanmean(reward)) if valid.any() else math.nan,
        kl=float(kl_sum.sum() / n_tok) if cfg.beta > 0 else math.nan,
        loss=loss,
        entropy=float(entropy),
        entropy_norm=float(entropy / math.log(vocab)),
        adv_mean=float(adv[valid].mean()) if valid.any() else math.nan,
        adv_std=float(adv[valid].std(ddof=1)) if valid.sum() > 1 else 0.0,
        frac_zero_std=float(zero.mean()),
        frac_zero_std_correct=float((zero & corr_g.all(1)).mean()),
        frac_zero_std_wrong=float((zero & ~corr_g.any(1)).mean()),
        train_acc=float(correct.mean()),
        response_len=float(length.mean()),
        response_len_correct=float(length[correct].mean()) if correct.any() else math.nan,
        response_len_wrong=float(length[~correct].mean()) if (~correct).any() else math.nan,
        truncation_rate=float(truncated.mean()),
        repetition=float(np.mean([repetition_rate(t) for t in texts["completions"]])),
        clip_frac=clip_frac,
        grad_norm=grad_norm,
        lr=lr,
        step_time=seconds,
        tokens_per_s=float(length.sum() / seconds),
        invalid_rewards=sum(scores.invalid.values()),
        skipped=skipped,
        **_mismatch(whole.mismatch),
        reward_components={k: float(np.nanmean(v)) if not np.isnan(v).all() else math.nan
                           for k, v in scores.components.items()},
        ranks=ranks,
        samples=Samples(reward=reward, components=scores.components, advantage=adv, correct=correct, length=length,
                        truncated=truncated.astype(bool), kl=kl_sum / np.maximum(length, 1),
                        entropy=ent_sum / np.maximum(length, 1), group_reward_std=group_std, logp_diff=whole.gaps,
                        **texts),
    )


MISMATCH = ("mismatch_kl", "logp_diff_mean", "logp_diff_max", "is_ratio_min", "is_ratio_mean", "is_ratio_max",
            "is_masked_frac")


def _mismatch(m: np.ndarray | None) -> dict:
    """StepStats' mismatch fields from the combined mismatch_sums (empty when nothing measured it: NaN)."""
    if m is None or m[0] == 0:  # a skipped step: no pass compared the two
        return {"unmeasured": frozenset(MISMATCH)}
    n, k3, gap, gap_max, r_min, r_max, r_sum, changed = m
    return dict(mismatch_kl=float(k3 / n), logp_diff_mean=float(gap / n), logp_diff_max=float(gap_max),
                is_ratio_min=float(r_min), is_ratio_mean=float(r_sum / n), is_ratio_max=float(r_max),
                is_masked_frac=float(changed / n))
