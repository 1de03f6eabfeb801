"""What a log's column means, read from its name: the vocabulary of per-step GRPO logs, not of one framework.

A column is ours by name (ALIASES: every spelling seen, in order of preference), else by meaning: the name
without its namespaces and its statistic (`env/all/reward/total` -> `reward`, `optim/entropy` -> `entropy`,
`loss:sum` -> `loss`, `mismatch_kl/all/mean` -> `mismatch_kl`) is looked up again; a correctness word
(`correct`, `accuracy`, `pass@1`, `exact_match`, ...) is the training samples' correctness, and under an
evaluation prefix (`eval/`, `val/`, `test/`) the held-out accuracy. Known columns that no row reads are
IGNORED with the reason. ingest.py reads the formats; this module only names things.
"""

from __future__ import annotations

import re

# The step of a row: the first of these a log has (lower-cased). `_step` is W&B's count of log calls, the
# step only where the trainer logs once a step: last. Without any, rows are numbered in order (ingest.py).
STEP_KEYS = ("step", "global_step", "train/global_step", "training/global_step", "trainer/global_step", "grpo_step",
             "train_step", "iteration", "iter", "update", "system/step", "progress/step", "optimizer_step", "_step")

# Our name -> the names logs in the wild use for it, in order of preference (lower-cased; the first present
# wins, the others are listed as ignored duplicates). KL: only KL to the reference; PPO's old-vs-new policy KL
# (approx_kl, actor/ppo_kl) measures one update, not drift (IGNORED), and the KL between the sampler and the
# trainer is the train/inference mismatch.
ALIASES: dict[str, tuple[str, ...]] = {
    "step": STEP_KEYS,
    "reward": ("reward", "reward_avg", "rewards_avg", "reward_mean", "rewards/mean", "reward/mean", "train/reward",
               "critic/score/mean", "critic/rewards/mean", "rewards", "avg_reward", "env/reward_mean", "mean_reward",
               "env/all/reward/total", "reward/total"),
    "kl": ("kl", "kl_mean", "kl_avg", "kl_loss", "kl_div", "kl_divergence", "objective/kl", "actor/kl_loss", "actor/kl",
           "critic/kl", "train/kl", "policy/kl", "kl_to_ref", "ref_kl"),
    "loss": ("loss", "train/loss", "training loss", "policy_loss", "actor/pg_loss", "pg_loss", "actor/loss",
             "train/policy_loss", "loss/policy", "loss/mean", "loss:sum"),  # training loss: the Trainer's notebook table
    "entropy": ("entropy", "entropy_avg", "entropy_mean", "actor/entropy", "actor/entropy_loss", "policy/entropy",
                "train/entropy", "objective/entropy", "entropy/mean", "optim/entropy", "token_entropy"),
    "entropy_norm": ("entropy_norm",),
    "adv_mean": ("adv_mean", "adv_avg", "advantages/mean"),  # not verl's critic/advantages/mean (IGNORED)
    "adv_std": ("adv_std", "advantages/std"),
    "frac_zero_std": ("frac_zero_std", "frac_reward_zero_std", "advantage/zero_rate"),
    "frac_zero_std_correct": ("frac_zero_std_correct",),
    "frac_zero_std_wrong": ("frac_zero_std_wrong",),
    "train_acc": ("train_acc", "train_accuracy", "train_accuracies_avg", "train/accuracy", "critic/acc/mean",
                  "acc/mean", "accuracy"),
    "reward_std": ("reward_std", "rewards/std", "critic/score/std", "reward/std"),
    "response_len": ("response_len", "avg_response_len", "completions/mean_length", "response_length/mean",
                     "response_length", "completion_length", "mean_length", "generate_len", "seq_len/mean",
                     "avg_response_token_length", "ac_tokens_per_turn"),
    "response_len_max": ("completions/max_length", "response_length/max", "max_response_len"),
    "response_len_correct": ("response_len_correct",),
    "response_len_wrong": ("response_len_wrong",),
    "truncation_rate": ("truncation_rate", "completions/clipped_ratio", "response_length/clip_ratio", "clipped_ratio",
                        "truncated_ratio", "length/cap_hit_rate", "is_truncated/mean"),
    "repetition": ("repetition",),  # ours: seq-rep-4 per completion, the step's mean
    "clip_frac": ("clip_frac", "actor/pg_clipfrac", "clip_ratio/region_mean", "clip_ratio", "pg_clipfrac", "clip_fraction"),
    "clip_low": ("clip_low", "clip_ratio/low_mean"),  # TRL: share of tokens clipped at 1 - epsilon (negative advantages)
    "clip_high": ("clip_high", "clip_ratio/high_mean"),  # ... at 1 + epsilon_high (positive advantages)
    "grad_norm": ("grad_norm", "actor/grad_norm", "train/grad_norm", "optim/grad_norm"),
    "lr": ("lr", "learning_rate", "actor/lr", "actor_lr", "train/learning_rate", "optim/lr"),
    "step_time": ("step_time", "timing_s/step", "time/step"),
    "tokens_per_s": ("tokens_per_s", "tokens_per_sec"),
    "sample_acc": ("sample_acc", "eval_acc", "eval_accuracy", "eval/accuracy", "val/accuracy", "val/acc", "test_acc",
                   "eval/pass_at_1", "eval/pass@1"),
    "greedy_acc": ("greedy_acc",),
    "eval_n": ("eval_n",),
    "steps_in_row": ("steps_in_row",),  # our record: optimizer steps a row's means cover (TRL's logging_steps)
    # The train/inference mismatch: the sampler's log-probs (vLLM's) against the trainer's for the same tokens.
    # Token means of an estimator of KL(sampler || trainer), best first: k3 (ours, prime-rl, verl's k3_kl, Tinker's
    # v2 is k2, as close for small gaps), then the signed k1 (OpenRLHF's vllm_kl, verl's rollout_corr/kl, Tinker's v1).
    "mismatch_kl": ("mismatch_kl", "mismatch_kl/mean", "mismatch_kl/all/mean", "rollout_corr/k3_kl",
                    "kl_sample_train_v2", "optim/kl_sample_train_v2", "vllm_kl", "rollout_corr/kl",
                    "kl_sample_train_v1", "optim/kl_sample_train_v1"),
    "logp_diff_mean": ("logp_diff_mean", "sampling/sampling_logp_difference/mean"),
    "logp_diff_max": ("logp_diff_max", "sampling/sampling_logp_difference/max"),
    "is_ratio_min": ("is_ratio_min", "sampling/importance_sampling_ratio/min", "rollout_corr/rollout_is_min"),
    "is_ratio_mean": ("is_ratio_mean", "sampling/importance_sampling_ratio/mean", "rollout_corr/rollout_is_mean"),
    "is_ratio_max": ("is_ratio_max", "sampling/importance_sampling_ratio/max", "rollout_corr/rollout_is_max"),
    "is_masked_frac": ("is_masked_frac", "is_masked/mean", "is_masked/all/mean", "is_masked",
                       "rollout_corr/rollout_rs_masked_fraction"),
}
BY_ALIAS = {a: name for name, aliases in ALIASES.items() for a in aliases}

# Columns we know and deliberately do not read, with the reason (listed in the notes).
IGNORED = {
    "approx_kl": "old-vs-new policy KL of one update, not KL to the reference",
    "actor/ppo_kl": "old-vs-new policy KL of one update, not KL to the reference",
    "ppo_kl": "old-vs-new policy KL of one update, not KL to the reference",
    "total_steps": "run length, not a per-step signal", "epoch": "not a per-step signal",
    "num_tokens": "cumulative token count", "policy_ratio": "no row reads the mean ratio (clip_frac does)",
    # verl (trainer/ppo/metric_utils.py): the mean over response tokens, so a long completion weighs more. Under
    # GRPO it is not 0 when every group's advantages are (they are per sequence); adv_mean is the per-sequence mean.
    "critic/advantages/mean": "verl's token-weighted advantage mean, not the per-sequence mean adv_mean reads",
    "actor/kl_coef": "a setting, not a signal", "critic/kl_coeff": "a setting, not a signal",
    "kl_coef": "a setting, not a signal", "beta": "a setting, not a signal",
    # OpenRLHF: the policy against the reference model, already read as KL; not the sampler against the trainer.
    "logprobs_diff": "OpenRLHF's policy-minus-reference log-prob, not the train/inference mismatch",
    # verl before rollout_corr/* (0.4-0.5): |p_rollout - p_train| in probability space, not on the log-prob scale
    # the mismatch row judges; its rollout_corr/* names are read.
    **{f"training/rollout_probs_diff_{s}": "verl's sampler-vs-trainer gap in probability, not log-probability: no row "
       "reads it (its rollout_corr/* names are read)" for s in ("mean", "max", "std")},
    "_runtime": "W&B's seconds since the run started", "_timestamp": "W&B's wall-clock time",
}

# An evaluation: a column under one of these prefixes (or TRL's eval_) is a held-out measurement of its step.
EVAL_PREFIX = re.compile(r"^(eval|val|valid|validation|test|heldout|held_out)([-_/]|$)", re.I)
# Its accuracy under another name (the first one wins). verl (0.3+) names its held-out reward
# val-core/<data source>/reward/mean@1: with a rule reward, the accuracy.
EVAL_ACCURACY = re.compile(r"^(eval|val|test|validation)[-_/].*(acc|accuracy|pass@?1|pass_at_1|score|correct|exact_match"
                           r"|/reward/mean@1$)", re.I)
# Reward components: ours (reward_<fn>), TRL (rewards/<fn>/mean; up to TRL 0.16 and in every Unsloth GRPO
# notebook rewards/<fn>), the book style (<fn>_reward[_avg|_mean]), reward/<fn>.
COMPONENT = [re.compile(p) for p in (r"^reward_(?P<fn>.+)$", r"^rewards/(?P<fn>[^/]+)/mean$", r"^rewards/(?P<fn>[^/]+)$",
                                     r"^(?P<fn>.+?)_reward(_avg|_mean)?$", r"^reward/(?P<fn>[^/]+)$")]
# reward_std, reward_mean: the combined reward; eval_reward (TRL): the combined reward of an evaluation
NOT_COMPONENT = {"std", "avg", "mean", "max", "min", "sum", "total", "eval"}

# Namespaces that say where a value was measured, not what it is, and the statistic a step's value is of:
# stripped to find the meaning (`env/all/reward/total` -> `reward`).
_NAMESPACE = re.compile(r"^(?:(?:env|all|train|training|rollout|rollouts|optim|optimizer|metrics|trainer|policy|actor|"
                        r"batch|sampling|loss_info)/)+")
_STATISTIC = re.compile(r"(?:/(?:mean|avg|average|total|sum|all))+$")
# The training samples' correctness: a word for it, never for the form of the answer.
_CORRECT = re.compile(r"(?:^|[_/])(?:correct|correctness|is_correct|mean_correct|accuracy|acc|answer_accuracy|"
                      r"pass_at_1|pass@1|exact_match|solve_rate|success_rate)$")
FORM = re.compile(r"format|length|len|style|xml|tag|think", re.I)  # the form of an answer, not its truth


def canonical(key: str) -> str:
    """A column's name without its namespaces and its statistic: what it measures. Lower-cased; `:` read as `/`."""
    k = key.strip().lower().replace(":", "/")
    return _STATISTIC.sub("", _NAMESPACE.sub("", k)) or k


def meaning(key: str) -> str | None:
    """Our name for a column the exact aliases did not claim, from what its name says; None if it says none.
    Statistics other than the step's central value (std, max, min, counts) mean nothing here."""
    low = key.strip().lower()
    if EVAL_PREFIX.match(low):
        return None  # held-out columns are read by EVAL_ACCURACY (the accuracy) or not at all
    k = canonical(low)
    if re.search(r"(?:^|[_/])(?:std|max|min|median|p\d+|count|frac_|num_)", k):
        return None
    if k in BY_ALIAS and BY_ALIAS[k] != "step":
        return BY_ALIAS[k]
    if _CORRECT.search(k) and not FORM.search(k):
        return "train_acc"
    return None


def is_eval_key(key: str) -> bool:
    """A column measured on a held-out set (`eval/...`, `val/...`, `test/...`, TRL's `eval_...`)."""
    return bool(EVAL_PREFIX.match(key.strip()) or key.strip().lower().startswith("eval_"))


def component(low: str) -> str | None:
    """The reward function a column is one component of, or None."""
    for pattern in COMPONENT:
        m = pattern.match(low)
        if m:
            fn = m.group("fn").strip("/_")
            if fn and fn not in NOT_COMPONENT and not fn.endswith(("/std", "_std")) and fn not in ALIASES:
                return re.sub(r"[^a-z0-9]+", "_", fn).strip("_")
    return None
