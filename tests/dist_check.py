"""Run under 2 ranks (tests/test_distributed.py starts it): one GRPO step over the same samples at 2
ranks and in one process must give the same statistics, loss, gradient norm and updated adapter; the
adapter must be bit-identical on both ranks; a NaN on one rank must skip the update on both.

The samples are made identical by sampling the whole batch once (same model, same seed, on every
rank) and handing each rank its own groups' rows in place of its own sampling."""

from __future__ import annotations

import json
import sys
from dataclasses import fields

import numpy as np
import torch

from grpo_sentinel.service.config import load_config
from grpo_sentinel.service.data import Verifier, load_datasets
from grpo_sentinel.service.distributed import SINGLE, from_env
from grpo_sentinel.service.grpo import step as step_mod
from grpo_sentinel.service.grpo.rollout import Rollout, sample
from grpo_sentinel.service.rewards import RewardScorer
from grpo_sentinel.service.trainer import build_policy

P, G = 4, 4


def length_reward(completion: str, answer: str, prompt: str) -> float:
    """A reward with spread inside every group, so the step has a gradient to compare."""
    return len(completion) / 8


def adapter(policy) -> torch.Tensor:
    return torch.cat([p.detach().flatten().double() for p in policy.trainable])


def rows(roll: Rollout, sel: slice) -> Rollout:
    return Rollout(**{f.name: (getattr(roll, f.name)[sel] if f.name != "texts" else roll.texts[sel])
                      for f in fields(Rollout)})


def one_step(cfg, examples, full: Rollout, dist, rows_of, hook: bool = False):
    """A fresh policy (same seed: same LoRA init), one grpo_step, whose sampling returns `rows_of(full)`."""
    policy = build_policy(cfg, dist=dist)
    scorer = RewardScorer(cfg.rewards, Verifier(cfg.data.verifier), cfg.grpo)
    step_mod.sample = lambda *a, **k: rows_of(full)
    handle = None
    if hook:  # a real NaN through the real model, on this rank only
        handle = policy.model.get_output_embeddings().register_forward_hook(lambda m, i, o: o * float("nan"))
    before = adapter(policy)
    grads = []  # the gradient each update applies (Adam's step would amplify float noise near 0)
    apply = policy.optimizer.step
    policy.optimizer.step = lambda: (grads.append(torch.cat([p.grad.flatten().double() for p in policy.trainable])),
                                     apply())
    stats = step_mod.grpo_step(policy, scorer, examples, cfg.grpo, step=1, dist=dist)
    if handle:
        handle.remove()
    return stats, before, adapter(policy), grads


def main() -> None:
    out = sys.argv[1]
    cfg = load_config(None, [f"grpo.prompts_per_step={P}", f"grpo.group_size={G}", "grpo.loss_type=dapo",
                             "grpo.micro_batch_size=3", "grpo.mu=2", "rewards=[{name: 'dist_check:length_reward'}]"])
    dist = from_env("cpu", 120)
    data = load_datasets(cfg.data, 0)
    examples = data.train[:P]
    policy = build_policy(cfg)
    torch.manual_seed(7)
    full = sample(policy.model, policy.tokenizer, [e.prompt for e in examples for _ in range(G)],
                  max_new_tokens=cfg.grpo.max_new_tokens, temperature=1.0, top_p=1.0)
    share = P // dist.world
    mine = slice(dist.rank * share * G, (dist.rank + 1) * share * G)
    two, before, after, two_grads = one_step(cfg, examples[dist.rank * share:(dist.rank + 1) * share], full, dist,
                                             lambda r: rows(r, mine))
    sums = dist.all_gather(float(after.sum()))
    identical = dist.all_gather(after.numpy().tobytes())
    nan_two, nan_before, nan_after, _ = one_step(cfg, examples[dist.rank * share:(dist.rank + 1) * share], full, dist,
                                                 lambda r: rows(r, mine), hook=dist.rank == 1)
    report = {}
    if dist.main:
        one, _, one_after, one_grads = one_step(cfg, examples, full, SINGLE, lambda r: r)
        report = {
            "checksums_equal": len(set(sums)) == 1,
            "adapters_bit_identical": len(set(identical)) == 1,
            "updated": bool((after != before).any()),
            "updates": [len(two_grads), len(one_grads)],
            # per update, the largest gradient difference relative to the gradient's own scale
            "grad_rel_diff": [float((a - b).abs().max() / b.abs().max()) for a, b in zip(two_grads, one_grads)],
            "nan_skipped": nan_two.skipped,
            "nan_adapter_unchanged": bool(torch.equal(nan_before, nan_after)),
            "scalars": {k: [getattr(two, k), getattr(one, k)] for k in (
                "reward", "kl", "loss", "entropy", "adv_mean", "adv_std", "frac_zero_std", "frac_zero_std_correct",
                "frac_zero_std_wrong", "train_acc", "response_len", "response_len_correct", "response_len_wrong",
                "truncation_rate", "clip_frac", "grad_norm")},
            "samples_equal": all(np.allclose(getattr(two.samples, k), getattr(one.samples, k), equal_nan=True, atol=1e-6)
                                 for k in ("reward", "advantage", "correct", "length", "truncated", "kl", "entropy",
                                           "group_reward_std")),
            "texts_equal": two.samples.completions == one.samples.completions and two.samples.prompts == one.samples.prompts,
            "ranks": [r.rank for r in two.ranks],
        }
    else:
        assert nan_two is None and two is None
    report["rank_adapter_unchanged_after_nan"] = bool(torch.equal(nan_before, nan_after))
    everyone = dist.all_gather(report)
    if dist.main:
        with open(out, "w") as f:
            json.dump(everyone, f)
    dist.close()


if __name__ == "__main__":
    main()
