"""TRL's logged values, and the per-completion rewards its wrapped reward functions saw, as our
per-step record (StepStats). Pure: nothing here imports TRL, so every rule is tested on plain
dicts and arrays, and the callback (trl.py) only wires it to the trainer.

What TRL logs is a mean over the logging interval (`logging_steps`; grad_norm and learning_rate
are the interval's last step): a row says how many optimizer steps it covers (`steps_in_row`).
What TRL does not log is NaN and marked unmeasured (not assessable), never filled in. Shapes: P
prompts, G completions each (`num_generations`), B = P * G, K reward functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from grpo_sentinel.telemetry.schema import Eval, Samples, StepStats
from grpo_sentinel.telemetry.stats import repetition_rate

# Our field -> the key TRL 1.16 logs it under.
LOGGED: dict[str, str] = {
    "reward": "reward", "kl": "kl", "loss": "loss", "entropy": "entropy",
    "response_len": "completions/mean_length", "truncation_rate": "completions/clipped_ratio",
    "clip_frac": "clip_ratio/region_mean", "grad_norm": "grad_norm", "lr": "learning_rate", "step_time": "step_time",
    # With vLLM and its importance-sampling correction on (TRL's default with use_vllm): the raw |log-prob gap|,
    # and the ratio after TRL truncated or masked it (grpo_trainer.py logs the tensor that goes into the loss:
    # in a mask mode its min is 0 once anything was masked). TRL logs no masked fraction.
    "logp_diff_mean": "sampling/sampling_logp_difference/mean", "logp_diff_max": "sampling/sampling_logp_difference/max",
    "is_ratio_min": "sampling/importance_sampling_ratio/min", "is_ratio_mean": "sampling/importance_sampling_ratio/mean",
    "is_ratio_max": "sampling/importance_sampling_ratio/max",
}
ZERO_STD = "frac_reward_zero_std"  # -> frac_zero_std, where TRL's flag is per group (see Setup.zero_std_per_group)
COMPONENT = "rewards/{}/mean"  # -> reward_<fn>
# TRL keys with no column in the record, by prefix, and why (summary.json lists the ones a run logged).
UNRECORDED: dict[str, str] = {
    "reward_std": "std over all completions: the signal is per group (frac_zero_std; the group std histogram "
                  "with wrapped rewards)",
    "rewards/": "per-function std (the means are reward_<fn>)",
    "completions/": "length extremes (the lengths' distribution is grpo_completion_length, with wrapped rewards)",
    "clip_ratio/": "the parts of clip_ratio/region_mean (clip_frac)",
    "num_tokens": "TRL's running count of prompt + completion tokens",
    "epoch": "not a per-step signal",
}
ADV_EPS = 1e-4  # TRL adds it to the std it divides by
AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
SCALINGS = ("group", "batch", "none")


@dataclass(frozen=True)
class Setup:
    """What the mapping reads from the trainer's own config."""

    group_size: int  # num_generations
    scale_rewards: str  # group | batch | none
    aggregation: str  # sum_then_normalize | normalize_then_sum
    names: tuple[str, ...]  # reward functions, in TRL's order
    weights: tuple[float, ...]  # reward_weights, aligned with names
    ln_vocab: float
    correctness: str | None = None  # the function that judges the answer: 1 right, 0 wrong
    stop_tokens: frozenset[int] = frozenset()  # EOS ids and the pad id: a completion ending otherwise was cut

    @property
    def zero_std_per_group(self) -> bool:
        """TRL's frac_reward_zero_std is the fraction of groups without signal only when it tests each
        group's std; under batch scaling or normalize_then_sum it tests the whole batch's (0 or 1)."""
        return self.scale_rewards != "batch" and self.aggregation == "sum_then_normalize"


@dataclass
class Generation:
    """One generation batch as the wrapped reward functions saw it: one rank's part, or all of them."""

    prompts: list[str]  # [B] each prompt once per completion
    completions: list[str]  # [B]
    answers: list[str]  # [B] the data set's answer column, "" without one
    lengths: list[int]  # [B] completion tokens, EOS included
    last_tokens: list[int]  # [B] each completion's last token id (tells a cut one)
    rewards: dict[str, list[float]] = field(default_factory=dict)  # function -> [B], NaN where it returned None


def merge(parts: list[Generation]) -> Generation:
    """The ranks' parts of one generation batch, in rank order: TRL's own (gathered) order."""
    names = parts[0].rewards.keys()
    return Generation(*(sum((getattr(p, f) for p in parts), []) for f in
                        ("prompts", "completions", "answers", "lengths", "last_tokens")),
                      rewards={n: sum((p.rewards[n] for p in parts), []) for n in names})


def kind(logs: dict) -> str:
    """train | eval | summary (the end-of-training totals) | other (a user's own trainer.log call)."""
    if "train_runtime" in logs:
        return "summary"
    if any(k.startswith("eval_") for k in logs):
        return "eval"
    return "train" if "loss" in logs or any(k in logs for k in LOGGED.values()) else "other"


def reward_names(logs: dict) -> list[str]:
    """The reward functions a log names (`rewards/<fn>/mean`, or `eval_rewards/...`), in TRL's order."""
    keys = [k.removeprefix("eval_") for k in logs]
    return [k[len("rewards/"):-len("/mean")] for k in keys if k.startswith("rewards/") and k.endswith("/mean")]


def unrecorded(keys) -> dict[str, str]:
    """The logged keys the record has no column for, with the reason."""
    mapped = {*LOGGED.values(), ZERO_STD}
    out = {}
    for k in keys:
        if k in mapped or (k.startswith("rewards/") and k.endswith("/mean")):
            continue
        out[k] = next((why for prefix, why in UNRECORDED.items() if k == prefix or k.startswith(prefix)),
                      "no column reads it")
    return out


def _nanmean(x: np.ndarray, axis=None, keepdims: bool = False) -> np.ndarray:
    n = (~np.isnan(x)).sum(axis=axis, keepdims=keepdims)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nansum(x, axis=axis, keepdims=keepdims) / n


def _nanstd(x: np.ndarray, axis=None, keepdims: bool = False) -> np.ndarray:
    """Unbiased std over the non-NaN values (TRL's nanstd): NaN with fewer than two."""
    n = (~np.isnan(x)).sum(axis=axis, keepdims=keepdims)
    with np.errstate(invalid="ignore", divide="ignore"):
        var = _nanmean((x - _nanmean(x, axis, keepdims=True)) ** 2, axis, keepdims) * n / (n - 1)
    return np.sqrt(var)


def combined(per_func: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """[B, K] -> [B]: the weighted sum TRL logs as `reward`, NaN where every function returned None."""
    reward = np.nansum(per_func * weights, axis=1)
    reward[np.isnan(per_func).all(axis=1)] = math.nan
    return reward


def advantages(per_func: np.ndarray, weights: np.ndarray, G: int, scale: str, aggregation: str) -> np.ndarray:
    """TRL 1.16's advantages of one generation batch (GRPOTrainer._generate_and_score_completions),
    from the rewards [B, K] (NaN where a function returned None); [B], 0 where nothing scored."""
    if aggregation == "sum_then_normalize":
        reward = combined(per_func, weights)
        groups = reward.reshape(-1, G)  # [P, G]
        centred = groups - _nanmean(groups, axis=1, keepdims=True)
        if scale == "group":
            centred = centred / ((_nanstd(groups, axis=1, keepdims=True) if G > 1 else 0.0) + ADV_EPS)
        elif scale == "batch":
            centred = centred / ((_nanstd(reward) if reward.size > 1 else 0.0) + ADV_EPS)
        adv = centred.reshape(-1)
    else:  # normalize_then_sum: each function normalised within its group, then the weighted sum over the batch
        grouped = per_func.reshape(-1, G, per_func.shape[1])  # [P, G, K]
        std_k = _nanstd(grouped, axis=1, keepdims=True) if G > 1 else 0.0
        normalised = ((grouped - _nanmean(grouped, axis=1, keepdims=True)) / (std_k + ADV_EPS)).reshape(per_func.shape)
        reward = np.nansum(normalised * weights, axis=1)
        reward[np.isnan(per_func).all(axis=1)] = math.nan  # unscorable: every function returned None
        adv = (reward - _nanmean(reward)) / ((_nanstd(reward) if reward.size > 1 else 0.0) + ADV_EPS)
    return np.nan_to_num(adv, nan=0.0)


def group_std(reward: np.ndarray, G: int) -> np.ndarray:
    """[B] -> [P]: unbiased std of each group's scored rewards; 0 with fewer than two (no signal either)."""
    std = _nanstd(reward.reshape(-1, G), axis=1)
    return np.where(np.isnan(std), 0.0, std)


def samples(gens: list[Generation], setup: Setup) -> Samples:
    """The per-completion values of the generation batches of one logged row."""
    G, names = setup.group_size, list(setup.names)
    per_func = np.concatenate([np.array([g.rewards[n] for n in names], dtype=float).T for g in gens])  # [B, K]
    weights = np.array(setup.weights, dtype=float)
    # Advantages per generation batch: batch scaling divides by each batch's own std.
    cuts = np.cumsum([len(g.prompts) for g in gens])[:-1]
    adv = np.concatenate([advantages(part, weights, G, setup.scale_rewards, setup.aggregation)
                          for part in np.split(per_func, cuts)])
    reward = combined(per_func, weights)
    prompts = [p for g in gens for p in g.prompts]
    answers = [a for g in gens for a in g.answers]
    unmeasured = {"kl", "entropy", "prompt_tokens"}  # TRL logs these as means only, or not at all
    if setup.correctness is None:
        unmeasured.add("correct")
        correct = np.zeros(len(reward), dtype=bool)
    else:
        correct = per_func[:, names.index(setup.correctness)] >= 1.0
    nan = np.full(len(reward), math.nan)
    return Samples(reward=reward, components={n: per_func[:, k] for k, n in enumerate(names)}, advantage=adv,
                   correct=correct, length=np.array([x for g in gens for x in g.lengths], dtype=float),
                   truncated=np.array([t not in setup.stop_tokens for g in gens for t in g.last_tokens], dtype=bool),
                   kl=nan, entropy=nan, group_reward_std=group_std(reward, G), prompts=tuple(prompts[::G]),
                   answers=tuple(answers[::G]), completions=tuple(c for g in gens for c in g.completions),
                   prompt_tokens=np.full(len(prompts) // G, math.nan), unmeasured=frozenset(unmeasured))


def _from_samples(x: Samples, setup: Setup, step_time: float, steps_in_row: int) -> dict:
    """The fields only the per-completion values give: advantages, the zero-signal split, correctness."""
    scored = ~np.isnan(x.reward)
    zero = x.group_reward_std <= 1e-8  # TRL: torch.isclose(std, 0)
    adv = x.advantage[scored]
    out = {"adv_mean": float(adv.mean()) if adv.size else math.nan,
           "adv_std": float(adv.std(ddof=1)) if adv.size > 1 else 0.0,
           "frac_zero_std": float(zero.mean()),
           "invalid_rewards": int((~scored).sum()),  # every function returned None: TRL excludes the completion
           "repetition": float(np.mean([repetition_rate(c) for c in x.completions])) if x.completions else math.nan}
    if math.isfinite(step_time) and step_time > 0 and steps_in_row:
        out["tokens_per_s"] = float(x.length.sum() / (step_time * steps_in_row))
    if "correct" not in x.unmeasured:
        # A completion the correctness function gave None is neither right nor wrong: only judged ones count.
        judged = ~np.isnan(x.components[setup.correctness])
        ok, wrong, length = x.correct, judged & ~x.correct, x.length
        def whole_group(v):  # [N] -> [N / G]: every completion of the group
            return v.reshape(-1, setup.group_size).all(1)

        out.update(frac_zero_std_correct=float((zero & whole_group(ok)).mean()),
                   frac_zero_std_wrong=float((zero & whole_group(wrong)).mean()),
                   train_acc=float(ok[judged].mean()) if judged.any() else math.nan,
                   response_len_correct=float(length[ok].mean()) if ok.any() else math.nan,
                   response_len_wrong=float(length[wrong].mean()) if wrong.any() else math.nan)
    return out


def _number(v) -> float | None:
    """A logged value as a float; None when TRL had none (it logs None where every value was NaN)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def step_stats(step: int, logs: dict, setup: Setup, steps_in_row: int, x: Samples | None = None) -> StepStats:
    """One logged training row. A measured non-finite value stays (it is an overflow, counted); a key
    TRL did not log is unmeasured."""
    known = {f: v for f, k in LOGGED.items() if (v := _number(logs.get(k))) is not None}
    if "entropy" in known:
        known["entropy_norm"] = known["entropy"] / setup.ln_vocab
    components = {n: v for n in setup.names if (v := _number(logs.get(COMPONENT.format(n)))) is not None}
    if x is not None:
        known.update(_from_samples(x, setup, known.get("step_time", math.nan), steps_in_row))
    elif setup.zero_std_per_group and (v := _number(logs.get(ZERO_STD))) is not None:
        known["frac_zero_std"] = v
    if "train_acc" not in known and setup.correctness in components:
        known["train_acc"] = components[setup.correctness]  # a 0/1 verdict's mean is the share accepted
    return StepStats.partial(step, steps_in_row=steps_in_row, reward_components=components, samples=x, **known)


def evaluation(logs: dict, setup: Setup, n: int | None) -> Eval | None:
    """TRL's evaluation as held-out accuracy: the correctness function's mean over the eval set's
    completions, sampled as in training (TRL has no greedy round). None without a correctness function."""
    acc = _number(logs.get("eval_" + COMPONENT.format(setup.correctness))) if setup.correctness else None
    if acc is None or not n:
        return None
    return Eval(sample_acc=acc, greedy_acc=math.nan, n=n)
