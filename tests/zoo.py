"""Synthetic run logs: a healthy GRPO run and one generator per pathology, with the conditions
each must (and must not) raise. Noise is sampled the way a real run samples it: per-step
rewards are Binomial(B, p) / B, a group has no signal with probability p^G + (1-p)^G, held-out
accuracy is Binomial(n, p) / n.

Each run also knows its truth: the noise-free held-out accuracy (`_acc_true`), so its damage step
(the first step where that accuracy is 10 % below its running peak) is known, and its onset
(ONSET, or 0 for the conditions present from the start): `truth(gen)`. The slow pathologies
(loss_blowup, kl_acceleration, entropy_drift, length_drift, format_hacking) start quietly at the
onset and only damage the accuracy tens of steps later: what lead time is measured on.
"""

from __future__ import annotations

import numpy as np

from grpo_sentinel.telemetry.health.runlog import RunLog

N, G, P, EVAL_N, EVERY, MAX_NEW = 300, 8, 8, 200, 20, 64
ONSET = 150  # where a pathology starts


def _healthy(rng: np.random.Generator, p: np.ndarray | None = None) -> dict[str, np.ndarray]:
    t = np.arange(1, N + 1, dtype=float)
    p = 0.2 + 0.4 * (1 - np.exp(-t / 100)) if p is None else p  # fast early, then diminishing
    b = P * G
    reward = rng.binomial(b, p) / b
    zero_p = p**G + (1 - p) ** G
    zero_correct = rng.binomial(P, p**G) / P
    zero_wrong = rng.binomial(P, (1 - p) ** G) / P
    kl = 0.002 + 0.05 * t / N * (1 + 0.1 * rng.standard_normal(N))  # bounded, slowly growing
    acc = np.full(N, np.nan)
    acc[EVERY - 1 :: EVERY] = rng.binomial(EVAL_N, p[EVERY - 1 :: EVERY] * 0.9) / EVAL_N
    return {
        "step": t, "reward": reward, "train_acc": reward.copy(), "kl": kl,
        "loss": 0.04 * kl + 0.002 * rng.standard_normal(N),
        "entropy": 0.6 - 0.1 * t / N + 0.03 * rng.standard_normal(N),
        "entropy_norm": (0.6 - 0.1 * t / N) / np.log(15) + np.zeros(N),
        "adv_mean": 1e-8 * rng.standard_normal(N), "adv_std": 0.85 + 0.02 * rng.standard_normal(N),
        "frac_zero_std": zero_correct + zero_wrong, "frac_zero_std_correct": zero_correct, "frac_zero_std_wrong": zero_wrong,
        "response_len": 3.5 + 0.1 * rng.standard_normal(N), "response_len_correct": 3.4 + 0.1 * rng.standard_normal(N),
        "response_len_wrong": 3.6 + 0.1 * rng.standard_normal(N), "truncation_rate": np.zeros(N),
        "sample_acc": acc, "_nonfinite": np.zeros(N), "_p": p, "_zero_p": zero_p, "_acc_true": p * 0.9,
    }


def _with_optimizer(s: dict, rng) -> dict:
    """The optimizer's columns of a healthy run: a log-normal gradient norm and the ratio clip active
    on ~0.2 % of tokens at either bound (drawn last, so the other scenarios' noise is unchanged)."""
    tokens = P * G * 40
    s.update(grad_norm=0.5 * np.exp(0.3 * rng.standard_normal(N)),
             clip_low=rng.binomial(tokens, 0.002, N) / tokens, clip_high=rng.binomial(tokens, 0.002, N) / tokens)
    return s


def _ramp(a: float, b: float) -> np.ndarray:
    """a before ONSET, then linearly to b at the end."""
    x = np.full(N, a)
    x[ONSET:] = np.linspace(a, b, N - ONSET)
    return x


def _drop(a: float, b: float, over: int = 30) -> np.ndarray:
    """a before ONSET, then down to b within `over` steps, and b after."""
    x = np.full(N, b)
    x[:ONSET] = a
    x[ONSET : ONSET + over] = np.linspace(a, b, over)
    return x


def _with_p(rng, p: np.ndarray, acc_scale: float | np.ndarray = 0.9) -> dict[str, np.ndarray]:
    s = _healthy(rng, p)
    s["_acc_true"] = np.clip(p * acc_scale, 0, 1)
    s["sample_acc"][EVERY - 1 :: EVERY] = rng.binomial(EVAL_N, s["_acc_true"][EVERY - 1 :: EVERY]) / EVAL_N
    return s


def _format_hacked(rng, delay: int, to: float, lag: int, fmt: np.ndarray) -> dict[str, np.ndarray]:
    """Format hacking: the verifier's acceptance p rises as a healthy run's, then from ONSET + delay falls
    linearly to `to` at the end, while a format reward paid with probability `fmt` [N] holds or rises (the
    combined reward is their sum); the held-out accuracy follows p `lag` steps later."""
    p = _decline(0.6, to, delay)
    late = np.concatenate([np.full(lag, p[0]), p[:-lag]])
    s = _with_p(rng, late)
    correct = rng.binomial(P * G, p) / (P * G)
    fmt = rng.binomial(P * G, fmt) / (P * G)
    s.update(train_acc=correct, reward_correct=correct, reward_format=fmt, reward=correct + fmt)
    return s


def _flat_then_falls(delay: int) -> np.ndarray:
    """The reward flat at 0.45, then from ONSET + delay linearly down to 0.2 at the end."""
    p = np.full(N, 0.45)
    p[ONSET + delay :] = np.linspace(0.45, 0.2, N - ONSET - delay)
    return p


def _decline(a: float, b: float, delay: int) -> np.ndarray:
    """The healthy rise up to ONSET + delay, then linearly down to b: damage follows an onset `delay` steps later."""
    t = np.arange(N, dtype=float)
    p = 0.2 + 0.4 * (1 - np.exp(-t / 100))
    start = ONSET + delay
    p[start:] = np.linspace(p[start], b, N - start)
    return p


def healthy(rng):
    return _healthy(rng)


def healthy_optimizer(rng):
    """Healthy, with the optimizer's columns (gradient norm, clip ratio at each bound) logged."""
    return _with_optimizer(_healthy(rng), rng)


def adv_mean_drift(rng):
    s = _healthy(rng)
    s["adv_mean"][ONSET:] = 0.05  # e.g. advantages normalised over the batch instead of the group
    return s


def nonfinite(rng):
    s = _healthy(rng)
    s["_nonfinite"][ONSET : ONSET + 4] = 1
    s["loss"][ONSET : ONSET + 4] = np.nan
    return s


def reward_saturated(rng):
    return _with_p(rng, np.minimum(0.999, 0.6 + 0.4 * (1 - np.exp(-np.arange(N) / 40))))  # a task too easy


def signal_vanished(rng):
    p = _drop(0.4, 0.002)  # the policy stops ever being right: every group all-wrong
    return _with_p(rng, p)


def kl_runaway(rng):
    s = _with_p(rng, np.concatenate([0.2 + 0.4 * (1 - np.exp(-np.arange(ONSET) / 100)), np.linspace(0.5, 0.2, N - ONSET)]))
    s["kl"] = s["kl"] + _ramp(0.0, 3.0)
    return s


def kl_dominant(rng):
    s = _with_p(rng, _drop(0.4, 0.0005))  # no signal left ...
    s["kl"] = s["kl"] + _ramp(0.0, 2.5)  # ... and KL is the only thing moving
    return s


def entropy_collapse(rng):
    s = _with_p(rng, np.full(N, 0.45))  # reward flat
    s["entropy"] = _ramp(0.6, 0.02) + 0.005 * rng.standard_normal(N)
    return s


def entropy_blowup(rng):
    s = _with_p(rng, np.concatenate([0.2 + 0.4 * (1 - np.exp(-np.arange(ONSET) / 100)), np.linspace(0.5, 0.05, N - ONSET)]))
    s["entropy"] = _ramp(0.6, 2.6) + 0.03 * rng.standard_normal(N)  # ln 15 = 2.71
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def exploration(rng):
    p = np.concatenate([np.full(ONSET, 0.25), np.linspace(0.25, 0.6, N - ONSET)])  # reward rising ...
    s = _with_p(rng, p)
    s["entropy"] = _ramp(0.6, 1.4) + 0.03 * rng.standard_normal(N)  # ... with the entropy: healthy
    return s


def late_degradation(rng):
    p = np.concatenate([0.2 + 0.4 * (1 - np.exp(-np.arange(ONSET) / 60)), np.linspace(0.55, 0.25, N - ONSET)])
    return _with_p(rng, p)


def reward_hacking(rng):
    p = 0.2 + 0.6 * (1 - np.exp(-np.arange(N) / 80))  # the grader keeps paying ...
    scale = np.concatenate([np.full(ONSET, 0.9), np.linspace(0.9, 0.3, N - ONSET)])  # ... for less and less real skill
    return _with_p(rng, p, scale)


def loss_spike(rng):
    """One update whose |loss| is ~300x the median of the steps before (0.5 among losses of ~0.002): a warning."""
    s = _healthy(rng)
    s["loss"][ONSET] = 0.5
    return s


def loss_catastrophe(rng):
    """One update four and a half orders of magnitude over the loss's scale (50 among ~0.002), as a summed
    loss of 6e11 among losses of ~1: critical at once; the run goes on unharmed (the step was skipped)."""
    s = _healthy(rng)
    s["loss"][ONSET] = 50.0
    return s


def policy_collapse(rng):
    """Healthy until the onset, then one answer for every prompt: every group alike (all wrong), the reward
    the same 0.25 at every step (what the answer's format earns, whatever the prompt), the loss exactly 0 and
    the KL frozen; the held-out accuracy collapses with it."""
    p = _decline(0.6, 0.0, 0)
    p[ONSET:] = 0.0
    s = _with_p(rng, p)
    s.update(reward=np.where(np.arange(N) >= ONSET, 0.25, s["reward"]), train_acc=np.where(np.arange(N) >= ONSET, 0.0,
                                                                                            s["train_acc"]))
    s["frac_zero_std"][ONSET:], s["frac_zero_std_wrong"][ONSET:], s["frac_zero_std_correct"][ONSET:] = 1.0, 1.0, 0.0
    s["loss"][ONSET:] = 0.0
    s["kl"][ONSET:] = s["kl"][ONSET - 1]
    return s


def _mismatch(rng, level: np.ndarray) -> np.ndarray:
    """A step's mismatch KL around `level`: a token mean over ~2,000 tokens, log-normal step to step (sd 20 %)."""
    return level * np.exp(0.2 * rng.standard_normal(N))


def healthy_bf16_mismatch(rng):
    """Healthy, sampled in bf16 and trained in fp32: a steady mismatch KL of ~1e-3, noisy, never growing."""
    s = _healthy(rng)
    s["mismatch_kl"] = _mismatch(rng, np.full(N, 1e-3))
    return s


def mismatch_growth(rng):
    """The sampler drifting from the trainer (Yao et al. 2025): the mismatch KL ~1e-4 until the onset, then doubling
    every 16 steps (1e-3 some 53 steps in, ~0.07 at the end); the accuracy goes 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.1, 60))
    level = np.full(N, 1e-4)
    level[ONSET:] = 1e-4 * 2 ** (np.arange(N - ONSET) / 16)
    s["mismatch_kl"] = _mismatch(rng, level)
    return s


def sampler_desync(rng):
    """Sampler and trainer agree to float32 rounding (k3 ~1e-13) until a weight hand-over is missed at the onset:
    the sampler keeps serving the old adapter while the policy moves on (k3 5e-3, growing)."""
    s = _with_p(rng, _decline(0.6, 0.2, 40))
    level = np.full(N, 1e-13)
    level[ONSET:] = np.linspace(5e-3, 0.05, N - ONSET)
    s["mismatch_kl"] = _mismatch(rng, level)
    return s


def capped_unrewarded(rng):
    """Every completion cut at the cap from the first step and every reward 0 (a cold start whose answers never
    fit): nothing can be learned, whatever the early level."""
    s = _with_p(rng, np.zeros(N), 0.0)
    s.update(truncation_rate=np.ones(N), response_len=np.full(N, float(MAX_NEW)))
    return s


def length_pathology(rng):
    s = _healthy(rng)
    s["truncation_rate"] = _ramp(0.0, 0.9)
    s["response_len"] = _ramp(3.5, MAX_NEW)
    return s


def plateau_kl_flat(rng):
    s = _with_p(rng, np.full(N, 0.3))  # beta so large nothing moves
    s["kl"] = 1e-5 * np.abs(rng.standard_normal(N))
    return s


def plateau_small_group(rng):
    s = _with_p(rng, np.full(N, 0.12), 1.0)  # a hard task at G = 4: most groups carry nothing
    p = np.full(N, 0.12)
    zc, zw = rng.binomial(P * 2, p**4) / (P * 2), rng.binomial(P * 2, (1 - p) ** 4) / (P * 2)
    s.update(frac_zero_std=zc + zw, frac_zero_std_correct=zc, frac_zero_std_wrong=zw, _group_size=np.array([4.0]))
    return s


def plateau_grader_loose(rng):
    s = _with_p(rng, np.full(N, 0.9), 0.45)  # the grader pays 90 % of the time ...
    s["train_acc"] = rng.binomial(P * G, 0.4, N) / (P * G)  # ... the verifier accepts 40 % of the same answers
    return s


def kl_only_learning(rng):
    s = _with_p(rng, np.full(N, 0.3))  # reward flat ...
    s["kl"] = _ramp(0.2, 0.01) + 0.005 * rng.standard_normal(N)  # ... while the optimiser shrinks KL
    s["kl"][:ONSET] = 0.2 + 0.005 * rng.standard_normal(ONSET)
    s["loss"] = 0.04 * s["kl"] + 0.0005 * rng.standard_normal(N)
    return s


def healthy_format(rng):
    """Healthy, with an auxiliary format reward (~0.9, steady): the combined reward exceeds 1."""
    s = _healthy(rng)
    fmt = rng.binomial(P * G, 0.9, N) / (P * G)
    s.update(reward_correct=s["reward"].copy(), reward_format=fmt, reward=s["reward"] + fmt)
    return s


def loss_blowup(rng):
    """The update blows up from the onset: |loss| grows tenfold every ~30 steps (heavy-tailed, as a
    GRPO loss is); 40 steps later the reward and the accuracy start to fall."""
    s = _with_p(rng, _decline(0.6, 0.15, 40))
    t = np.arange(N)
    grow = np.where(t >= ONSET, 0.002 * np.exp((t - ONSET) / 13.0), 0.0)
    s["loss"] = s["loss"] + grow * np.abs(rng.standard_t(3, N))
    return s


def kl_acceleration(rng):
    """KL grows exponentially from the onset (doubling every ~10 steps from 0.005); the reward falls
    once it is large."""
    s = _with_p(rng, _decline(0.6, 0.15, 50))
    t = np.arange(N)
    s["kl"] = s["kl"] + np.where(t >= ONSET, 0.005 * np.exp((t - ONSET) / 15.0), 0.0)
    return s


def entropy_drift(rng):
    """Entropy drifts up slowly from the onset while the reward is flat; the accuracy falls later."""
    s = _with_p(rng, _flat_then_falls(50))
    s["entropy"] = _ramp(0.6, 1.5) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def length_drift(rng):
    """Completions drift toward the cap from the onset, more of them capped; wrong ones (cut
    answers) follow, and the accuracy falls once most are cut."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    s["response_len"] = _ramp(3.5, 0.95 * MAX_NEW) + 0.1 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, np.clip(_ramp(0.0, 0.85), 0, 1)) / (P * G)
    return s


def format_hacking(rng):
    """A format reward that can be gamed: from the onset it rises to its maximum while the verifier's
    acceptance of the same training samples falls; the combined reward holds, so the reward alone
    looks healthy. The held-out accuracy falls with the training correctness, a little later."""
    t = np.arange(N, dtype=float)
    p = 0.2 + 0.4 * (1 - np.exp(-t / 100))
    p[ONSET:] = np.linspace(p[ONSET], 0.25, N - ONSET)
    lag = np.concatenate([np.full(30, p[0]), p[:-30]])  # held-out sees it ~30 steps later
    s = _with_p(rng, lag)
    correct = rng.binomial(P * G, p) / (P * G)
    fmt = rng.binomial(P * G, np.clip(_ramp(0.6, 1.0), 0, 1)) / (P * G)
    s.update(train_acc=correct, reward_correct=correct, reward_format=fmt, reward=correct + fmt)
    s["_acc_true"] = np.clip(lag * 0.9, 0, 1)
    return s


def no_progress(rng):
    """The reward never moves (a reward function that rarely pays), while the KL grows as in a healthy run."""
    return _with_p(rng, np.full(N, 0.05))


def zero_gradient(rng):
    """From the onset the gradient norm is exactly 0: the adapter was detached, nothing trains."""
    s = _with_optimizer(_healthy(rng), rng)
    s["grad_norm"][ONSET:] = 0.0
    return s


def kl_offset(rng):
    """An SFT start measured against its base model: KL ~ 1.2 from step 1, not growing; the run learns."""
    s = _healthy(rng)
    s["kl"] = 1.2 + 0.05 * rng.standard_normal(N)
    return s


def grad_norm_spike(rng):
    s = _with_optimizer(_healthy(rng), rng)
    s["grad_norm"][ONSET] = 40.0
    return s


def clip_imbalance(rng):
    """From the onset the upper clip binds on ~3 % of tokens, the lower one stays at ~0.2 %."""
    s = _with_optimizer(_healthy(rng), rng)
    s["clip_high"] = rng.binomial(P * G * 40, np.clip(_ramp(0.002, 0.03), 0, 1)) / (P * G * 40)
    return s


def length_capped(rng):
    """Completions run to the cap from the onset: within 30 steps nearly all are cut, and the accuracy goes."""
    s = _with_p(rng, _decline(0.6, 0.1, 20))
    s["truncation_rate"] = rng.binomial(P * G, _drop(0.0, 0.97)) / (P * G)
    s["response_len"] = _drop(3.5, MAX_NEW - 1) + 0.1 * rng.standard_normal(N)
    return s


def repetition(rng):
    """From the onset a growing share of completions fall into loops (seq-rep-4 ~0.7 each, ~0.02 for the
    others): the step's mean, over 64 completions, passes 0.3 ~80 steps in; the accuracy falls from 80 steps in."""
    s = _with_p(rng, _decline(0.6, 0.2, 80))
    looping = rng.binomial(P * G, np.clip(_ramp(0.0, 0.8), 0, 1)) / (P * G)
    s["repetition"] = np.clip(0.7 * looping + 0.02 * (1 - looping) + 0.005 * rng.standard_normal(N), 0, 1)
    return s


# Healthy families with realistic noise. The four below were first held out (issue 22), then seen
# failing, and the loss rows and no_progress were changed on them: they are now part of the fit
# set (FIT_HEALTHY, seeds 0-299). The false-page rate is reported on REPORT_HEALTHY: other shapes
# of the same four kinds of noise, written before any detector was run on them, on seeds 1000-1299
# (benchmarks/bench_lead_time.py --only calibration, docs/explanation/lead-time.md).


def healthy_t3_loss(rng):
    """Healthy, with a heavy-tailed loss: Student t, 3 degrees of freedom (a GRPO loss is a mean of
    advantage-weighted ratios; its outliers are far from Gaussian)."""
    s = _healthy(rng)
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_t(3, N)
    return s


def healthy_growing_loss(rng):
    """Healthy, with a loss scale that grows fivefold over the run (longer completions, a rising LR
    warm-up): the early range is not the late range."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_normal(N)) * np.linspace(1, 5, N)
    return s


def healthy_plateau_rise(rng):
    """Healthy: the reward flat for its first 100 steps (the policy finding the format), then rising."""
    t = np.arange(N, dtype=float)
    p = np.where(t < 100, 0.2, 0.2 + 0.4 * (1 - np.exp(-(t - 100) / 80)))
    return _with_p(rng, p)


def healthy_noisy_eval(rng):
    """Healthy, evaluated on 50 problems instead of 200: four times the variance per evaluation."""
    s = _healthy(rng)
    s["sample_acc"][EVERY - 1 :: EVERY] = rng.binomial(50, s["_acc_true"][EVERY - 1 :: EVERY]) / 50
    s["_eval_n"] = np.array([50.0])
    return s


def _plateau(rng, flat: int, tau: float):
    t = np.arange(N, dtype=float)
    return _with_p(rng, np.where(t < flat, 0.2, 0.2 + 0.4 * (1 - np.exp(-(t - flat) / tau))))


def report_t3_growing(rng):
    """Student t (3 dof) loss noise on a scale growing threefold over the run, exponentially."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_t(3, N)) * np.exp(np.log(3) * np.arange(N) / N)
    return s


def report_t3_noisy(rng):
    """Student t (3 dof) loss noise five times larger, the KL term a quarter: the loss is mostly noise."""
    s = _healthy(rng)
    s["loss"] = 0.01 * s["kl"] + 0.01 * rng.standard_t(3, N)
    return s


def report_growing_x10(rng):
    """A loss scale growing tenfold over the run, quadratically (slow first, fast at the end)."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_normal(N)) * (1 + 9 * (np.arange(N) / N) ** 2)
    return s


def report_plateau_60(rng):
    """The reward flat for 60 steps, then rising fast."""
    return _plateau(rng, 60, 50.0)


def report_plateau_150(rng):
    """The reward flat for 150 steps (half the run), then rising slowly."""
    return _plateau(rng, 150, 120.0)


def _evaluated(rng, n: int, every: int) -> dict[str, np.ndarray]:
    """A healthy run evaluated every `every` steps on `n` problems (binomial draws of its true accuracy)."""
    return _with_evals(_healthy(rng), rng, every, n)


def report_noisy_eval_30(rng):
    """Evaluated every 10 steps on 30 problems."""
    return _evaluated(rng, 30, every=10)


# Report set 2 (issue 22, after the escalation): the first report set was seen failing and two detectors
# changed on it, so it is "seen" now. These were written, committed and declared in the benchmark before
# any detector was run on them, on seeds 2000-2299 no family ran with before.


def new_t3_linear_x6(rng):
    """Student t (3 dof) loss noise on a scale growing sixfold over the run, linearly."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_t(3, N)) * np.linspace(1, 6, N)
    return s


def new_loss_exp_x20(rng):
    """A loss scale growing twentyfold over the run, exponentially (2.7x per 100 steps)."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_normal(N)) * np.exp(np.log(20) * np.arange(N) / N)
    return s


def new_noisy_eval_20_every5(rng):
    """Evaluated every 5 steps on 20 problems."""
    return _evaluated(rng, 20, every=5)


def new_plateau_100_slow(rng):
    """The reward flat for 100 steps, then rising slowly."""
    return _plateau(rng, 100, 200.0)


def new_kl_linear_steep(rng):
    """Healthy, with a KL growing linearly and steeply (to 0.6 at step 300): linear growth is not acceleration."""
    s = _healthy(rng)
    s["kl"] = 0.002 + 0.6 * np.arange(1, N + 1) / N * (1 + 0.1 * rng.standard_normal(N))
    return s


def new_lengths_rising_learning(rng):
    """Healthy, with completions growing from 3.5 to 20 tokens (of 64) while the run learns (longer reasoning)."""
    s = _healthy(rng)
    s["response_len"] = np.linspace(3.5, 20, N) + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.01, N) / (P * G)
    return s


REPORT2_HEALTHY = (new_t3_linear_x6, new_loss_exp_x20, new_noisy_eval_20_every5, new_plateau_100_slow,
                   new_kl_linear_steep, new_lengths_rising_learning)
REPORT2_SEEDS = range(2000, 2300)
SLOW_REPORT2_SEEDS = range(2000, 2020)  # the slow pathologies' new seeds (same generators)

# Report set 3 (issue 22, third pass): new *shapes* of each slow pathology, and new healthy families,
# written and committed before any detector ran on them (seeds 3000-3299; the pathologies' 3000-3019).
# Each damage is defined as the existing generators define it: the noise-free held-out accuracy
# (`_acc_true`) 10 % below its running peak. `_onset` is where the pathology starts when that is not ONSET.


def _ease(start: int, power: float = 1.0, end: int = N) -> np.ndarray:
    """0 before `start`, then ((t - start) / (end - start)) ** power up to 1 at `end` (and 1 after)."""
    t = np.arange(N, dtype=float)
    return np.clip((t - start) / (end - start), 0, 1) ** power


def r3_length_late_accel(rng):
    """Lengths start creeping late (step 180) and accelerate (quadratically) to 95 % of the cap; the capped
    share follows to 85 %; the accuracy falls from step 250 (the capped share then ~0.3)."""
    s = _with_p(rng, _decline(0.6, 0.2, 100))
    x = _ease(180, 2.0)
    s["response_len"] = 3.5 + (0.95 * MAX_NEW - 3.5) * x + 0.1 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.85 * x) / (P * G)
    s["_onset"] = np.array([180.0])
    return s


def r3_length_step_creep(rng):
    """At the onset lengths step up (3.5 -> 16 tokens, 5 % capped), then creep linearly to 95 % of the cap,
    85 % capped; the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    x = _ease(ONSET)
    on = np.arange(N) >= ONSET
    s["response_len"] = np.where(on, 16 + (0.95 * MAX_NEW - 16) * x, 3.5) + 0.1 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, np.where(on, 0.05 + 0.8 * x, 0.0)) / (P * G)
    return s


def _kl_exp_after_onset(rng, base: float, tau: float, delay: int) -> dict[str, np.ndarray]:
    """A healthy run's KL plus base e^((t - ONSET) / tau) from the onset (doubling every tau ln 2 steps); the
    accuracy falls from `delay` steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, delay))
    t = np.arange(N)
    s["kl"] = s["kl"] + np.where(t >= ONSET, base * np.exp((t - ONSET) / tau), 0.0)
    return s


def r3_kl_exp_slow(rng):
    """KL grows exponentially from the onset, more slowly (from 0.01, doubling every ~17 steps); the accuracy
    falls from 60 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.01, 25.0, 60)


def r3_kl_quadratic(rng):
    """KL grows quadratically from the onset (to 3.0 at the end: 0.48 60 steps in, 1.1 90 steps in); the
    accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 60))
    s["kl"] = s["kl"] + 3.0 * _ease(ONSET, 2.0)
    return s


def r3_format_saturate_early(rng):
    """A gameable format reward saturates within 20 steps of the onset (0.6 -> 1.0); the verifier's acceptance
    then erodes slowly (to 0.3 at the end); held-out sees it ~30 steps later."""
    return _format_hacked(rng, 0, 0.3, 30, np.clip(0.6 + 0.4 * _ease(ONSET, 1.0, ONSET + 20), 0, 1))


def r3_entropy_late_fall(rng):
    """Entropy creeps up from the onset (0.6 -> 1.4) with the reward flat; the reward and the accuracy fall
    late, from 90 steps after the onset."""
    s = _with_p(rng, _flat_then_falls(90))
    s["entropy"] = _ramp(0.6, 1.4) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def r3_loss_power(rng):
    """The loss blows up polynomially from the onset (|loss| ~ ((t - onset) / 8)^3: x10 in ~17 steps, x1000 in
    80); the accuracy falls from 40 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 40))
    t = np.arange(N)
    grow = np.where(t >= ONSET, 0.002 * ((t - ONSET) / 8.0) ** 3, 0.0)
    s["loss"] = s["loss"] + grow * np.abs(rng.standard_t(3, N))
    return s


def r3_loss_exp_offgrid(rng):
    """An exponential blow-up (x10 every ~46 steps) starting at step 170, off the 50-step blocks; the accuracy
    falls from step 210."""
    s = _with_p(rng, _decline(0.6, 0.15, 60))
    t = np.arange(N)
    grow = np.where(t >= 170, 0.002 * np.exp((t - 170) / 20.0), 0.0)
    s["loss"] = s["loss"] + grow * np.abs(rng.standard_t(3, N))
    s["_onset"] = np.array([170.0])
    return s


def h3_kl_rise_plateau(rng):
    """Healthy: the KL rises fast early (to ~0.3 by step 120) and plateaus."""
    s = _healthy(rng)
    s["kl"] = 0.002 + 0.3 * (1 - np.exp(-np.arange(1, N + 1) / 40)) * (1 + 0.1 * rng.standard_normal(N))
    return s


def h3_lengths_grow_stabilise(rng):
    """Healthy: completions grow from 3.5 to ~35 tokens (of 64) over the first ~150 steps and stabilise; the
    capped share follows from 1 % to ~6 %."""
    s = _healthy(rng)
    x = 1 - np.exp(-np.arange(N) / 50)
    s["response_len"] = 3.5 + 31.5 * x + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.01 + 0.05 * x) / (P * G)
    return s


def h3_entropy_rise_settle(rng):
    """Healthy: the entropy rises early (0.6 -> 1.1 over 80 steps) and settles there while the run learns."""
    s = _healthy(rng)
    s["entropy"] = 0.6 + 0.5 * _ease(0, 1.0, 80) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def h3_noisy_eval_25_every25(rng):
    """Healthy, evaluated every 25 steps on 25 problems."""
    return _evaluated(rng, 25, every=25)


def h3_loss_linear_x30(rng):
    """Healthy, with a loss scale growing thirtyfold over the run, linearly."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_normal(N)) * np.linspace(1, 30, N)
    return s


def h3_format_first(rng):
    """Healthy: the format reward is learned first (0.3 -> 0.95 over 60 steps) while correctness stays flat,
    then correctness rises."""
    t = np.arange(N, dtype=float)
    s = _with_p(rng, np.where(t < 60, 0.2, 0.2 + 0.4 * (1 - np.exp(-(t - 60) / 80))))
    fmt = rng.binomial(P * G, 0.3 + 0.65 * _ease(0, 1.0, 60)) / (P * G)
    s.update(reward_correct=s["reward"].copy(), reward_format=fmt, reward=s["reward"] + fmt)
    return s


REPORT3_SLOW = (r3_length_late_accel, r3_length_step_creep, r3_kl_exp_slow, r3_kl_quadratic, r3_format_saturate_early,
                r3_entropy_late_fall, r3_loss_power, r3_loss_exp_offgrid)
REPORT3_HEALTHY = (h3_kl_rise_plateau, h3_lengths_grow_stabilise, h3_entropy_rise_settle, h3_noisy_eval_25_every25,
                   h3_loss_linear_x30, h3_format_first)
REPORT3_SEEDS = range(3000, 3300)
SLOW_REPORT3_SEEDS = range(3000, 3020)


# Report set 4 (issue 22, fourth pass): again new shapes of each slow pathology and new healthy families,
# written and committed before any detector ran on them (seeds 4000-4299; the pathologies' 4000-4019).
# Damage as above: the noise-free held-out accuracy 10 % below its running peak.


def _logistic(centre: float, width: float) -> np.ndarray:
    """0 -> 1 along a logistic curve centred at step `centre`, `width` steps per e-fold."""
    return 1 / (1 + np.exp(-(np.arange(N, dtype=float) - centre) / width))


def r4_length_sigmoid(rng):
    """Lengths rise to the cap along a logistic curve centred 50 steps after the onset (a slow start, a fast
    middle, a flat end); the capped share follows to 90 %; the accuracy falls from 70 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    rise = _logistic(ONSET + 50, 12)
    x = np.clip((rise - rise[ONSET]) / (1 - rise[ONSET]), 0, 1)  # 0 at the onset
    s["response_len"] = 3.5 + (0.95 * MAX_NEW - 3.5) * x + 0.1 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.9 * x) / (P * G)
    return s


def r4_length_noisy_creep(rng):
    """Lengths creep linearly from the onset to 95 % of the cap with a noisy mean length (sd 2 tokens a step);
    the capped share to 85 %; the accuracy falls from 50 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 50))
    s["response_len"] = _ramp(3.5, 0.95 * MAX_NEW) + 2.0 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, np.clip(_ramp(0.0, 0.85), 0, 1)) / (P * G)
    return s


def r4_kl_linear_then_exp(rng):
    """KL first grows linearly from the onset (+0.002 a step), then, 30 steps in, exponentially (doubling every
    ~12 steps); the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 60))
    t = np.arange(N, dtype=float)
    lin = np.where(t >= ONSET, 0.002 * (t - ONSET), 0.0)
    exp = np.where(t >= ONSET + 30, 0.02 * (np.exp((t - ONSET - 30) / 17.0) - 1), 0.0)
    s["kl"] = s["kl"] + lin + exp
    return s


def r4_kl_exp_elevated(rng):
    """A run whose KL already sits high (~0.15, noisy) grows exponentially from the onset (from 0.02, doubling
    every ~14 steps); the accuracy falls from 55 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 55))
    t = np.arange(N)
    s["kl"] = 0.15 * (1 + 0.15 * rng.standard_normal(N)) + np.where(t >= ONSET, 0.02 * np.exp((t - ONSET) / 20.0), 0.0)
    return s


def r4_loss_exp_late_fast(rng):
    """A fast exponential blow-up (x10 every ~25 steps) from step 200; the accuracy falls from step 230."""
    s = _with_p(rng, _decline(0.6, 0.15, 80))
    t = np.arange(N)
    grow = np.where(t >= 200, 0.002 * np.exp((t - 200) / 11.0), 0.0)
    s["loss"] = s["loss"] + grow * np.abs(rng.standard_t(3, N))
    s["_onset"] = np.array([200.0])
    return s


def r4_loss_exp_heavy_base(rng):
    """A loss whose healthy noise is already heavy (Student t, 2 dof, 3x the usual scale) blows up from the
    onset (x10 every ~35 steps); the accuracy falls from 45 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 45))
    t = np.arange(N)
    s["loss"] = 0.04 * s["kl"] + 0.006 * rng.standard_t(2, N)
    grow = np.where(t >= ONSET, 0.002 * np.exp((t - ONSET) / 15.0), 0.0)
    s["loss"] = s["loss"] + grow * np.abs(rng.standard_t(3, N))
    return s


def r4_entropy_step_creep(rng):
    """Entropy steps up at the onset (0.6 -> 0.8) and creeps on to 1.6 with the reward flat; the reward and the
    accuracy fall from 60 steps after the onset."""
    s = _with_p(rng, _flat_then_falls(60))
    on = np.arange(N) >= ONSET
    s["entropy"] = np.where(on, 0.8 + 0.8 * _ease(ONSET), 0.6) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def r4_format_slow_rise(rng):
    """A gameable format reward rises slowly from the onset (0.5 -> 1.0 over 150 steps) while the verifier's
    acceptance falls linearly (to 0.2 at the end); held-out sees it ~20 steps later."""
    return _format_hacked(rng, 0, 0.2, 20, np.clip(_ramp(0.5, 1.0), 0, 1))


def h4_loss_sqrt_x10(rng):
    """Healthy, with a loss scale growing tenfold over the run along a square root (fastest at the start)."""
    s = _healthy(rng)
    s["loss"] = (0.04 * s["kl"] + 0.002 * rng.standard_normal(N)) * (1 + 9 * np.sqrt(np.arange(N) / (N - 1)))
    return s


def h4_loss_t2(rng):
    """Healthy, with a loss noise of infinite variance (Student t, 2 dof)."""
    s = _healthy(rng)
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_t(2, N)
    return s


def h4_entropy_dip_recover(rng):
    """Healthy: the entropy dips early (0.6 -> 0.45 over 50 steps) and recovers to 0.55 by step 150."""
    s = _healthy(rng)
    t = np.arange(N, dtype=float)
    s["entropy"] = np.where(t < 50, 0.6 - 0.15 * t / 50, 0.45 + 0.1 * np.clip((t - 50) / 100, 0, 1))
    s["entropy"] = s["entropy"] + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def h4_kl_jump_settle(rng):
    """Healthy: the KL jumps to ~0.15 within 30 steps (a high learning rate's first updates), then grows slowly."""
    s = _healthy(rng)
    t = np.arange(1, N + 1, dtype=float)
    s["kl"] = (0.15 * (1 - np.exp(-t / 10)) + 0.05 * t / N) * (1 + 0.1 * rng.standard_normal(N))
    return s


def h4_lengths_shrink(rng):
    """Healthy: completions shorten from 20 to 8 tokens over the first 100 steps (the run learns to be concise);
    the capped share from 3 % to 0."""
    s = _healthy(rng)
    x = np.clip(np.arange(N) / 100, 0, 1)
    s["response_len"] = 20 - 12 * x + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.03 * (1 - x)) / (P * G)
    return s


def h4_late_learner(rng):
    """Healthy: the reward is flat at 0.15 for 100 steps, then learned within ~40 steps to 0.55 (a late start);
    evaluated every 10 steps on 100 problems."""
    s = _with_p(rng, 0.15 + 0.4 * _logistic(120, 8))
    acc = np.full(N, np.nan)
    acc[9::10] = rng.binomial(100, s["_acc_true"][9::10]) / 100
    s["sample_acc"], s["_eval_n"] = acc, np.array([100.0])
    return s


# Report set 5 (issue 22, fifth pass): new shapes and healthy families, written and committed before any
# detector ran on them (seeds 5000-5299; the pathologies' 5000-5019). The healthy families lean on held-out
# evaluations of other sizes and cadences, and on noise shapes the other sets lack.


def _with_evals(s: dict, rng, every: int, n: int) -> dict:
    """The run's held-out evaluations replaced: every `every` steps on `n` problems, of its noise-free accuracy."""
    acc = np.full(N, np.nan)
    acc[every - 1 :: every] = rng.binomial(n, s["_acc_true"][every - 1 :: every]) / n
    s["sample_acc"], s["_eval_n"] = acc, np.array([float(n)])
    return s


def h5_eval_small_frequent(rng):
    """Healthy, evaluated every 5 steps on 50 problems (small, frequent evaluations: many noisy tests a run)."""
    return _evaluated(rng, 50, every=5)


def h5_two_stage(rng):
    """Healthy, learned in two stages: 0.2 -> 0.4 by step 60, flat to step 160, then 0.4 -> 0.6 by step 220;
    evaluated every 10 steps on 100 problems."""
    t = np.arange(N, dtype=float)
    p = 0.2 + 0.2 * np.clip(t / 60, 0, 1) + 0.2 * np.clip((t - 160) / 60, 0, 1)
    return _with_evals(_with_p(rng, p), rng, 10, 100)


def h5_slow_learner_small_eval(rng):
    """Healthy, learning slowly and steadily (0.3 -> 0.5 over the run), evaluated every 10 steps on 40 problems."""
    return _with_evals(_with_p(rng, np.linspace(0.3, 0.5, N)), rng, 10, 40)


def h5_kl_cosine(rng):
    """Healthy: the KL swings with a cyclic learning rate (0.03 +- 0.02, a period of 75 steps) and grows slowly."""
    s = _healthy(rng)
    t = np.arange(N, dtype=float)
    s["kl"] = (0.03 + 0.02 * np.sin(2 * np.pi * t / 75) + 0.03 * t / N) * (1 + 0.1 * rng.standard_normal(N))
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h5_loss_contaminated(rng):
    """Healthy, with a loss whose noise is 95 % N(0, 0.002) and 5 % N(0, 0.03): rare large updates."""
    s = _healthy(rng)
    big = rng.random(N) < 0.05
    s["loss"] = 0.04 * s["kl"] + np.where(big, 0.03, 0.002) * rng.standard_normal(N)
    return s


def h5_entropy_sharpen(rng):
    """Healthy: the entropy falls steadily (0.6 -> 0.35) as the policy sharpens while the reward rises."""
    s = _healthy(rng)
    s["entropy"] = np.linspace(0.6, 0.35, N) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def r5_length_exp_creep(rng):
    """Lengths grow exponentially from the onset (doubling every ~25 steps from 3.5 tokens) until they hit
    95 % of the cap; the capped share follows; the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    t = np.arange(N, dtype=float)
    length = np.minimum(3.5 * np.exp(np.clip(t - ONSET, 0, None) / 36.0), 0.95 * MAX_NEW)
    s["response_len"] = length + 0.2 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, np.clip((length - 3.5) / (0.95 * MAX_NEW - 3.5), 0, 1) * 0.9) / (P * G)
    return s


def r5_kl_exp_fast(rng):
    """KL grows exponentially from a tiny base at the onset (0.002, doubling every ~10 steps); the accuracy
    falls from 45 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 45))
    t = np.arange(N)
    s["kl"] = s["kl"] + np.where(t >= ONSET, 0.002 * (np.exp((t - ONSET) / 14.0) - 1), 0.0)
    return s


def r5_entropy_linear_fast(rng):
    """Entropy creeps linearly from the onset (0.6 -> 2.0 at the end) with the reward flat; the reward and the
    accuracy fall from 40 steps after the onset."""
    s = _with_p(rng, _flat_then_falls(40))
    s["entropy"] = _ramp(0.6, 2.0) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def r5_format_jump_then_fall(rng):
    """A gameable format reward jumps at the onset (0.5 -> 0.9 within 20 steps) while the verifier's acceptance
    falls linearly from 10 steps after it (to 0.25 at the end); held-out sees it ~15 steps later."""
    t = np.arange(N, dtype=float)
    return _format_hacked(rng, 10, 0.25, 15, 0.5 + 0.4 * np.clip((t - ONSET) / 20, 0, 1))


def r5_loss_exp_slow(rng):
    """A slow exponential blow-up (x10 every ~50 steps) from the onset; the accuracy falls from 70 steps after it."""
    s = _with_p(rng, _decline(0.6, 0.15, 70))
    t = np.arange(N)
    grow = np.where(t >= ONSET, 0.002 * np.exp((t - ONSET) / 22.0), 0.0)
    s["loss"] = s["loss"] + grow * np.abs(rng.standard_t(3, N))
    return s


REPORT5_SLOW = (r5_length_exp_creep, r5_kl_exp_fast, r5_entropy_linear_fast, r5_format_jump_then_fall,
                r5_loss_exp_slow)
REPORT5_HEALTHY = (h5_eval_small_frequent, h5_two_stage, h5_slow_learner_small_eval, h5_kl_cosine,
                   h5_loss_contaminated, h5_entropy_sharpen)
REPORT5_SEEDS = range(5000, 5300)
SLOW_REPORT5_SEEDS = range(5000, 5020)


# Report set 6 (issue 22, fifth pass): declared after report set 5 was measured (its cyclic KL paged kl_acceleration
# critical on 67 of 300 healthy runs) and before any detector was changed for it (seeds 6000-6299; the
# pathologies' 6000-6019): other KL schedules a healthy run may show, other noise, and three slow shapes.


def h6_kl_warmup_hump(rng):
    """Healthy: the KL climbs fast during a learning-rate warm-up (to ~0.08 by step 40), falls back to ~0.04 by
    step 100 and then grows slowly."""
    s = _healthy(rng)
    t = np.arange(N, dtype=float)
    hump = 0.08 * (t / 40) ** 2 * np.exp(2 * (1 - t / 40))
    s["kl"] = (0.002 + hump + 0.04 * np.clip(t / 100, 0, 1) + 0.02 * t / N) * (1 + 0.1 * rng.standard_normal(N))
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h6_kl_milestones(rng):
    """Healthy: the KL steps up at the learning-rate schedule's milestones (steps 100 and 200, +0.03 each over
    ~15 steps) and is flat between them."""
    s = _healthy(rng)
    s["kl"] = (0.02 + 0.03 * (_logistic(100, 4) + _logistic(200, 4))) * (1 + 0.1 * rng.standard_normal(N))
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h6_kl_slow_cycle(rng):
    """Healthy: the KL swings slowly (a period of 150 steps, +- 0.015) around a slow growth."""
    s = _healthy(rng)
    t = np.arange(N, dtype=float)
    s["kl"] = (0.03 + 0.015 * np.sin(2 * np.pi * t / 150 + 1.0) + 0.03 * t / N) * (1 + 0.1 * rng.standard_normal(N))
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h6_group_of_4(rng):
    """Healthy, with groups of 4 completions (more groups without signal) and 16 prompts a step."""
    s = _healthy(rng)
    p = s["_p"]
    zero_correct, zero_wrong = rng.binomial(16, p**4) / 16, rng.binomial(16, (1 - p) ** 4) / 16
    s.update(frac_zero_std=zero_correct + zero_wrong, frac_zero_std_correct=zero_correct, frac_zero_std_wrong=zero_wrong)
    s["_group_size"] = np.array([4.0])
    return s


def h6_loss_laplace(rng):
    """Healthy, with a Laplace loss noise (exponential tails, 1.5x the usual scale)."""
    s = _healthy(rng)
    s["loss"] = 0.04 * s["kl"] + rng.laplace(0, 0.003 / np.sqrt(2), N)
    return s


def h6_entropy_oscillate(rng):
    """Healthy: the entropy swings with a sampling-temperature schedule (+- 0.05, a period of 60 steps)."""
    s = _healthy(rng)
    t = np.arange(N, dtype=float)
    s["entropy"] = 0.6 - 0.1 * t / N + 0.05 * np.sin(2 * np.pi * t / 60) + 0.03 * rng.standard_normal(N)
    s["entropy_norm"] = s["entropy"] / np.log(15)
    return s


def r6_kl_exp_after_hump(rng):
    """A warm-up KL hump (as h6_kl_warmup_hump), then from the onset exponential growth (from 0.01, doubling
    every ~12 steps); the accuracy falls from 50 steps after the onset."""
    s = h6_kl_warmup_hump(rng)
    s.update({k: v for k, v in _with_p(rng, _decline(0.6, 0.15, 50)).items() if k in ("_acc_true", "sample_acc")})
    t = np.arange(N)
    s["kl"] = s["kl"] + np.where(t >= ONSET, 0.01 * (np.exp((t - ONSET) / 17.0) - 1), 0.0)
    return s


def r6_length_jump_creep(rng):
    """Lengths jump at the onset (3.5 -> 12 tokens within 10 steps), then creep linearly to 95 % of the cap;
    the capped share follows to 80 %; the accuracy falls from 55 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 55))
    t = np.arange(N, dtype=float)
    jump = 8.5 * np.clip((t - ONSET) / 10, 0, 1)
    creep = (0.95 * MAX_NEW - 12) * np.clip((t - ONSET - 10) / (N - ONSET - 10), 0, 1)
    s["response_len"] = 3.5 + jump + creep + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.8 * np.clip((t - ONSET - 10) / (N - ONSET - 10), 0, 1)) / (P * G)
    return s


def r6_format_fast_fall(rng):
    """A format reward climbs from the onset (0.4 -> 1.0 over 60 steps) while the verifier's acceptance falls fast
    (to 0.1 by the end); held-out sees it ~10 steps later."""
    t = np.arange(N, dtype=float)
    return _format_hacked(rng, 0, 0.1, 10, 0.4 + 0.6 * np.clip((t - ONSET) / 60, 0, 1))


REPORT6_SLOW = (r6_kl_exp_after_hump, r6_length_jump_creep, r6_format_fast_fall)
REPORT6_HEALTHY = (h6_kl_warmup_hump, h6_kl_milestones, h6_kl_slow_cycle, h6_group_of_4, h6_loss_laplace,
                   h6_entropy_oscillate)
REPORT6_SEEDS = range(6000, 6300)
SLOW_REPORT6_SEEDS = range(6000, 6020)


# Report set 7 (issue 22, fifth pass): healthy families only, declared after report set 6 was measured and before
# kl_only_learning was changed for the false warnings sets 4-6 showed (seeds 7000-7299): other losses.


def h7_loss_bursts(rng):
    """Healthy, with bursts of large updates: 2 % of steps carry 20x the usual loss noise."""
    s = _healthy(rng)
    s["loss"] = 0.04 * s["kl"] + np.where(rng.random(N) < 0.02, 0.04, 0.002) * rng.standard_normal(N)
    return s


def h7_loss_small_kl_term(rng):
    """Healthy, with a small beta: the loss's KL term a quarter of the usual under the same noise."""
    s = _healthy(rng)
    s["loss"] = 0.01 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h7_loss_skewed(rng):
    """Healthy, with a right-skewed loss noise (log-normal, sigma 1, centred; the usual scale)."""
    s = _healthy(rng)
    s["loss"] = 0.04 * s["kl"] + 0.0015 * (rng.lognormal(0, 1, N) - np.exp(0.5))
    return s


def h7_kl_fast_then_flat(rng):
    """Healthy: the KL rises to ~0.06 within 30 steps and stays there; the loss follows its KL term."""
    s = _healthy(rng)
    t = np.arange(1, N + 1, dtype=float)
    s["kl"] = 0.06 * (1 - np.exp(-t / 10)) * (1 + 0.1 * rng.standard_normal(N))
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


REPORT7_HEALTHY = (h7_loss_bursts, h7_loss_small_kl_term, h7_loss_skewed, h7_kl_fast_then_flat)
REPORT7_SEEDS = range(7000, 7300)


# Report set 8 (issue 22, sixth pass): declared before any detector ran on it and before kl_acceleration's
# growth test is changed (seeds 8000-8299; the pathologies' 8000-8019). KL growth a detector must tell apart:
# exponentials doubling more slowly than once a window, and healthy KLs that rise steadily to 0.1-0.4, which
# a test of "growth that holds" must not take for a runaway.


def _kl_follows(s: dict, kl: np.ndarray, rng) -> dict:
    """A healthy run's KL replaced by `kl` (10 % multiplicative noise), the loss following its KL term."""
    s["kl"] = kl * (1 + 0.1 * rng.standard_normal(N))
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h8_kl_linear_high(rng):
    """Healthy: the KL rises linearly all run, to 0.4 at the end."""
    t = np.arange(1, N + 1, dtype=float)
    return _kl_follows(_healthy(rng), 0.002 + 0.4 * t / N, rng)


def h8_kl_late_linear(rng):
    """Healthy: the KL is flat at 0.02 to step 100, then rises linearly to 0.3 at the end."""
    return _kl_follows(_healthy(rng), 0.02 + 0.28 * _ease(100), rng)


def h8_kl_sqrt(rng):
    """Healthy: the KL grows as the square root of the step, to 0.35 at the end."""
    t = np.arange(1, N + 1, dtype=float)
    return _kl_follows(_healthy(rng), 0.35 * np.sqrt(t / N), rng)


def h8_kl_logistic(rng):
    """Healthy: the KL rises along a logistic curve (0.01 -> 0.13, centred at step 150, 10 steps per e-fold)
    and settles: exponential in its first half."""
    return _kl_follows(_healthy(rng), 0.01 + 0.12 * _logistic(150, 10), rng)


def h8_kl_two_ramps(rng):
    """Healthy: the KL rises linearly to 0.1 at step 150, then three times as steeply, to 0.4 at the end."""
    return _kl_follows(_healthy(rng), 0.002 + 0.098 * _ease(0, 1.0, 150) + 0.3 * _ease(150), rng)


def r8_kl_exp_30(rng):
    """KL grows exponentially from the onset, doubling every ~30 steps (0.03 -> ~1 at the end); the accuracy
    falls from 80 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.03, 43.0, 80)


def r8_kl_exp_tiny_base(rng):
    """KL grows exponentially from a tiny base at the onset, doubling every ~21 steps (0.005 -> 0.74); the
    accuracy falls from 90 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.005, 30.0, 90)


def r8_kl_exp_elevated_slow(rng):
    """A KL already high (~0.1, noisy) grows exponentially from the onset, doubling every ~24 steps (0.02 ->
    1.5); the accuracy falls from 70 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.15, 70))
    t = np.arange(N)
    s["kl"] = 0.1 * (1 + 0.15 * rng.standard_normal(N)) + np.where(t >= ONSET, 0.02 * np.exp((t - ONSET) / 35.0), 0.0)
    return s


REPORT8_SLOW = (r8_kl_exp_30, r8_kl_exp_tiny_base, r8_kl_exp_elevated_slow)
REPORT8_HEALTHY = (h8_kl_linear_high, h8_kl_late_linear, h8_kl_sqrt, h8_kl_logistic, h8_kl_two_ramps)
REPORT8_SEEDS = range(8000, 8300)
SLOW_REPORT8_SEEDS = range(8000, 8020)


# Report set 9 (issue 22, sixth pass): declared after report set 8 was measured (its late-linear KL, a hinge, warned
# on half its runs) and before kl_acceleration was changed for it (seeds 9000-9299; the pathologies' 9000-9019):
# KLs whose slope steps up (a learning-rate warm-up ending, a schedule change), and slow exponentials.


def h9_kl_warmup_hinge(rng):
    """Healthy: the KL is flat at 0.01 through a warm-up to step 60, then rises linearly to 0.25."""
    return _kl_follows(_healthy(rng), 0.01 + 0.24 * _ease(60), rng)


def h9_kl_late_steep_hinge(rng):
    """Healthy: the KL is flat at 0.03 to step 200, then rises steeply and linearly to 0.3."""
    return _kl_follows(_healthy(rng), 0.03 + 0.27 * _ease(200), rng)


def h9_kl_double_hinge(rng):
    """Healthy: the KL's slope steps up twice, at steps 80 and 180 (0.02 -> 0.08 -> 0.35)."""
    return _kl_follows(_healthy(rng), 0.02 + 0.06 * _ease(80, 1.0, 180) + 0.27 * _ease(180), rng)


def h9_kl_noisy_linear(rng):
    """Healthy: the KL rises linearly to 0.3, with 20 % noise instead of 10 %."""
    t = np.arange(1, N + 1, dtype=float)
    s = _kl_follows(_healthy(rng), 0.002 + 0.3 * t / N, rng)
    s["kl"] = s["kl"] * (1 + 0.1 * rng.standard_normal(N))
    return s


def r9_kl_exp_40(rng):
    """KL grows exponentially from the onset, doubling every ~40 steps (0.05 -> 0.67); the accuracy falls from
    80 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.05, 58.0, 80)


def r9_kl_hinge_then_exp(rng):
    """A KL rising linearly after a warm-up hinge at step 60 (as h9_kl_warmup_hinge) grows exponentially from the
    onset too, doubling every ~20 steps (0.01 -> 1.8); the accuracy falls from 60 steps after the onset."""
    s = h9_kl_warmup_hinge(rng)
    s.update({k: v for k, v in _with_p(rng, _decline(0.6, 0.15, 60)).items() if k in ("_acc_true", "sample_acc")})
    t = np.arange(N)
    s["kl"] = s["kl"] + np.where(t >= ONSET, 0.01 * (np.exp((t - ONSET) / 29.0) - 1), 0.0)
    return s


REPORT9_SLOW = (r9_kl_exp_40, r9_kl_hinge_then_exp)
REPORT9_HEALTHY = (h9_kl_warmup_hinge, h9_kl_late_steep_hinge, h9_kl_double_hinge, h9_kl_noisy_linear)
REPORT9_SEEDS = range(9000, 9300)
SLOW_REPORT9_SEEDS = range(9000, 9020)



# Report set 10 (issue 22, seventh pass): declared after report set 9 was measured and before any detector ran on
# it or was changed for it (seeds 10000-10299; the pathologies' 10000-10019). KLs whose slope steps up at other
# places, steepness and noise (a hinge warned on a fifth to half of set 8's and 9's runs), a step up that then
# stays, slow exponentials on other bases and noise; and lengths creeping to the cap along other paths.


def h10_kl_mid_hinge(rng):
    """Healthy: the KL is flat at 0.04 to step 150, then rises linearly to 0.35 at the end."""
    return _kl_follows(_healthy(rng), 0.04 + 0.31 * _ease(150), rng)


def h10_kl_early_steep_hinge(rng):
    """Healthy: the KL is flat at 0.02 to step 40, rises steeply and linearly to 0.5 at step 240, then holds."""
    return _kl_follows(_healthy(rng), 0.02 + 0.48 * _ease(40, 1.0, 240), rng)


def h10_kl_triple_hinge(rng):
    """Healthy: the KL's slope steps up three times, at steps 60, 140 and 220 (0.01 -> 0.04 -> 0.12 -> 0.3)."""
    return _kl_follows(_healthy(rng), 0.01 + 0.03 * _ease(60, 1.0, 140) + 0.08 * _ease(140, 1.0, 220)
                       + 0.18 * _ease(220), rng)


def h10_kl_hinge_heavy_noise(rng):
    """Healthy: the KL is flat at 0.03 to step 120, then rises linearly to 0.3, under 25 % log-normal noise."""
    s = _healthy(rng)
    s["kl"] = (0.03 + 0.27 * _ease(120)) * rng.lognormal(-0.03, 0.25, N)  # mean 1: e^(-0.03 + 0.25^2 / 2)
    s["loss"] = 0.04 * s["kl"] + 0.002 * rng.standard_normal(N)
    return s


def h10_kl_step_then_flat(rng):
    """Healthy: the KL steps from 0.02 to 0.15 over 15 steps at step 100 (a reference or schedule change) and
    stays."""
    return _kl_follows(_healthy(rng), 0.02 + 0.13 * _ease(100, 1.0, 115), rng)


def _lengths_grow(rng, x: np.ndarray, length: tuple[float, float], cut: tuple[float, float]) -> dict[str, np.ndarray]:
    """A healthy run whose completions grow along x ([N], 0 -> 1): the mean length length[0] + length[1] x tokens
    (noise 0.5 a step) and the capped share cut[0] + cut[1] x (binomial over the P x G completions)."""
    s = _healthy(rng)
    s["response_len"] = length[0] + length[1] * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, cut[0] + cut[1] * x) / (P * G)
    return s


def h10_lengths_late_growth(rng):
    """Healthy: completions grow from 6 to ~30 tokens (of 64) over steps 100-200 (the run learns to reason
    longer) and stay; the capped share from 1 % to 5 %."""
    return _lengths_grow(rng, _ease(100, 1.0, 200), (6, 24), (0.01, 0.04))


def r10_kl_exp_25(rng):
    """KL grows exponentially from the onset, doubling every ~25 steps (0.02 -> ~1.3 at the end); the accuracy
    falls from 75 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.02, 36.0, 75)


def r10_kl_linear_then_exp(rng):
    """A KL rising linearly all run (0 -> 0.1 at the onset) grows exponentially from the onset too, doubling
    every ~28 steps (0.01 -> 0.4); the accuracy falls from 80 steps after the onset."""
    s = _kl_exp_after_onset(rng, 0.01, 40.0, 80)
    s["kl"] = s["kl"] + 0.1 * np.arange(N) / ONSET
    return s


def r10_kl_exp_noisy(rng):
    """KL grows exponentially from the onset, doubling every ~30 steps (0.03 -> ~1), under 25 % multiplicative
    noise; the accuracy falls from 80 steps after the onset."""
    s = _kl_exp_after_onset(rng, 0.03, 43.0, 80)
    s["kl"] = s["kl"] * rng.lognormal(-0.03, 0.25, N)
    return s


def r10_length_creep_from_long(rng):
    """Completions already long (30 of 64 tokens, 5 % capped) creep linearly from the onset to 95 % of the cap,
    the capped share to 85 %; the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    x = _ease(ONSET)
    s["response_len"] = 30 + (0.95 * MAX_NEW - 30) * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.05 + 0.8 * x) / (P * G)
    return s


def r10_length_sqrt_creep(rng):
    """Lengths creep from the onset as the square root of the time (fast first, then slower) to 95 % of the cap;
    the capped share follows to 85 %; the accuracy falls from 70 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    x = _ease(ONSET, 0.5)
    s["response_len"] = 3.5 + (0.95 * MAX_NEW - 3.5) * x + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.85 * x) / (P * G)
    return s


REPORT10_SLOW = (r10_kl_exp_25, r10_kl_linear_then_exp, r10_kl_exp_noisy, r10_length_creep_from_long,
                 r10_length_sqrt_creep)
REPORT10_HEALTHY = (h10_kl_mid_hinge, h10_kl_early_steep_hinge, h10_kl_triple_hinge, h10_kl_hinge_heavy_noise,
                    h10_kl_step_then_flat, h10_lengths_late_growth)
REPORT10_SEEDS = range(10000, 10300)
SLOW_REPORT10_SEEDS = range(10000, 10020)


# Report set 11 (issue 22, seventh pass): declared after report set 10 was measured (a hinge from flat no longer
# warned; a slope that steps up while the KL already rises still did, on sets 8 and 9) and before kl_acceleration
# was changed for it (seeds 11000-11299; the pathologies' 11000-11019): slopes stepping up by 2x to 4x on a rising
# KL, and exponentials fast and slow, some on a rising KL.


def h11_kl_slope_doubles(rng):
    """Healthy: the KL rises linearly (0.01 -> 0.1 at step 150), then twice as steeply, to 0.28 at the end."""
    return _kl_follows(_healthy(rng), 0.01 + 0.09 * _ease(0, 1.0, 150) + 0.18 * _ease(150), rng)


def h11_kl_slope_quadruples(rng):
    """Healthy: the KL rises linearly (0.02 -> 0.06 at step 120), then four times as steeply, to 0.3 at step 240,
    then holds."""
    return _kl_follows(_healthy(rng), 0.02 + 0.04 * _ease(0, 1.0, 120) + 0.24 * _ease(120, 1.0, 240), rng)


def h11_kl_three_slopes_noisy(rng):
    """Healthy: the KL's slope steps up at steps 100 and 200 (0.01 -> 0.05 -> 0.13 -> 0.33), under 20 % noise."""
    s = _kl_follows(_healthy(rng), 0.01 + 0.04 * _ease(0, 1.0, 100) + 0.08 * _ease(100, 1.0, 200) + 0.2 * _ease(200), rng)
    s["kl"] = s["kl"] * (1 + 0.1 * rng.standard_normal(N))
    return s


def h11_kl_slope_up_then_down(rng):
    """Healthy: the KL rises slowly, steps up to three times that slope at step 90, back down at step 170 (a
    learning-rate schedule's peak): 0.02 -> 0.05 -> 0.2 -> 0.25."""
    return _kl_follows(_healthy(rng), 0.02 + 0.03 * _ease(0, 1.0, 90) + 0.15 * _ease(90, 1.0, 170) + 0.05 * _ease(170),
                       rng)


def r11_kl_exp_fast_on_ramp(rng):
    """A KL rising linearly (0.02 -> 0.08 at the onset) grows exponentially from the onset, doubling every ~10 steps
    (0.002 -> ~1.4 at step 240); the accuracy falls from 60 steps after the onset."""
    s = _kl_exp_after_onset(rng, 0.002, 14.0, 60)
    s["kl"] = s["kl"] + 0.02 + 0.06 * np.minimum(np.arange(N) / ONSET, 2.0)
    return s


def r11_kl_exp_35(rng):
    """KL grows exponentially from the onset, doubling every ~35 steps (0.04 -> ~0.8 at the end); the accuracy
    falls from 90 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.04, 50.0, 90)


def r11_kl_exp_15_elevated(rng):
    """A KL already at 0.08 grows exponentially from the onset, doubling every ~15 steps (0.005 -> ~5); the accuracy
    falls from 60 steps after the onset."""
    s = _kl_exp_after_onset(rng, 0.005, 22.0, 60)
    s["kl"] = s["kl"] + 0.08
    return s


REPORT11_SLOW = (r11_kl_exp_fast_on_ramp, r11_kl_exp_35, r11_kl_exp_15_elevated)
REPORT11_HEALTHY = (h11_kl_slope_doubles, h11_kl_slope_quadruples, h11_kl_three_slopes_noisy, h11_kl_slope_up_then_down)
REPORT11_SEEDS = range(11000, 11300)
SLOW_REPORT11_SEEDS = range(11000, 11020)


# Report set 12 (issue 22, seventh pass): declared after report set 11 was measured and before the KL forecast
# was changed for it (seeds 12000-12299; the pathologies' 12000-12019). KLs that rise along logistic curves and
# settle (exponential until they bend; set 8's one paged critical on a third of its runs), and exponentials from
# a flat KL, one after such a rise.


def h12_kl_logistic_slow(rng):
    """Healthy: the KL rises along a logistic curve (0.02 -> 0.2, centred at step 160, 20 steps per e-fold)."""
    return _kl_follows(_healthy(rng), 0.02 + 0.18 * _logistic(160, 20), rng)


def h12_kl_logistic_small(rng):
    """Healthy: a small, quick logistic rise (0.005 -> 0.08, centred at step 120, 8 steps per e-fold)."""
    return _kl_follows(_healthy(rng), 0.005 + 0.075 * _logistic(120, 8), rng)


def h12_kl_logistic_late(rng):
    """Healthy: a late logistic rise (0.03 -> 0.25, centred at step 220, 15 steps per e-fold)."""
    return _kl_follows(_healthy(rng), 0.03 + 0.22 * _logistic(220, 15), rng)


def h12_kl_two_logistics(rng):
    """Healthy: two logistic steps (0.01 -> 0.06 at step 100, -> 0.15 at step 200, 10 steps per e-fold)."""
    return _kl_follows(_healthy(rng), 0.01 + 0.05 * _logistic(100, 10) + 0.09 * _logistic(200, 10), rng)


def r12_kl_exp_12(rng):
    """KL grows exponentially from the onset, doubling every ~12 steps from 0.003 (~1 at step 250); the accuracy
    falls from 60 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.003, 17.0, 60)


def r12_kl_exp_20(rng):
    """KL grows exponentially from the onset, doubling every ~20 steps from 0.01 (~1.8 at the end); the accuracy
    falls from 75 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.01, 29.0, 75)


def r12_kl_exp_after_logistic(rng):
    """A KL that rose along a logistic curve to 0.1 by step 100 grows exponentially from the onset, doubling every
    ~20 steps (0.01 -> ~1.8); the accuracy falls from 70 steps after the onset."""
    s = _kl_exp_after_onset(rng, 0.01, 29.0, 70)
    s["kl"] = s["kl"] + 0.1 * _logistic(70, 10)
    return s


REPORT12_SLOW = (r12_kl_exp_12, r12_kl_exp_20, r12_kl_exp_after_logistic)
REPORT12_HEALTHY = (h12_kl_logistic_slow, h12_kl_logistic_small, h12_kl_logistic_late, h12_kl_two_logistics)
REPORT12_SEEDS = range(12000, 12300)
SLOW_REPORT12_SEEDS = range(12000, 12020)


# Report set 13 (issue 22, seventh pass): declared after report set 12 was measured and before length_drift was
# changed for it (seeds 13000-13299; the pathologies' 13000-13019). Healthy runs whose completions grow a long way
# with more of them cut (to 15 %), and lengths that creep to the cap from short completions, late, or with the
# capped share lagging.


def h13_lengths_grow_more_capped(rng):
    """Healthy: completions grow from 5 to 40 tokens (of 64) over steps 50-200 (longer reasoning) and the capped
    share from 1 % to 15 %; both then hold."""
    return _lengths_grow(rng, _ease(50, 1.0, 200), (5, 35), (0.01, 0.14))


def h13_lengths_early_growth(rng):
    """Healthy: completions grow from 4 to 45 tokens over the first 120 steps, the capped share from 2 % to 10 %."""
    return _lengths_grow(rng, 1 - np.exp(-np.arange(N) / 40), (4, 41), (0.02, 0.08))


def h13_lengths_noisy_stable(rng):
    """Healthy: completions ~20 tokens with a noisy mean (sd 3 tokens a step), 5 % capped."""
    s = _healthy(rng)
    s["response_len"] = 20 + 3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.05, N) / (P * G)
    return s


def h13_lengths_grow_then_shrink(rng):
    """Healthy: completions grow from 6 to 35 tokens by step 150, then shorten to 20 (the run learns to be concise);
    the capped share 1 % -> 8 % -> 3 %."""
    s = _healthy(rng)
    up, down = _ease(0, 1.0, 150), _ease(150)
    s["response_len"] = 6 + 29 * up - 15 * down + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.01 + 0.07 * up - 0.05 * down) / (P * G)
    return s


def r13_length_exp_from_short(rng):
    """Lengths grow exponentially from 3 tokens at the onset, doubling every ~20 steps, until 95 % of the cap; the
    capped share follows to 90 %; the accuracy falls from 55 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 55))
    t = np.arange(N, dtype=float)
    length = np.minimum(3 * np.exp(np.clip(t - ONSET, 0, None) / 29.0), 0.95 * MAX_NEW)
    s["response_len"] = length + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.9 * np.clip((length - 3) / (0.95 * MAX_NEW - 3), 0, 1)) / (P * G)
    return s


def r13_length_late_linear(rng):
    """Lengths creep linearly from step 170 to 95 % of the cap at the end, the capped share to 85 %; the accuracy
    falls from step 240."""
    s = _with_p(rng, _decline(0.6, 0.2, 90))
    x = _ease(170)
    s["response_len"] = 4 + (0.95 * MAX_NEW - 4) * x + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.85 * x) / (P * G)
    s["_onset"] = np.array([170.0])
    return s


def r13_length_share_lags(rng):
    """Lengths creep linearly from the onset to 95 % of the cap; the capped share lags them (quadratic, to 85 %); the
    accuracy falls from 65 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 65))
    x = _ease(ONSET)
    s["response_len"] = 4 + (0.95 * MAX_NEW - 4) * x + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.85 * x**2) / (P * G)
    return s


REPORT13_SLOW = (r13_length_exp_from_short, r13_length_late_linear, r13_length_share_lags)
REPORT13_HEALTHY = (h13_lengths_grow_more_capped, h13_lengths_early_growth, h13_lengths_noisy_stable,
                    h13_lengths_grow_then_shrink)
REPORT13_SEEDS = range(13000, 13300)
SLOW_REPORT13_SEEDS = range(13000, 13020)


# Report set 14 (issue 22, eighth pass): declared after report set 13 was measured and before length_drift's held
# stage was changed for it (seeds 14000-14299; the pathologies' 14000-14019). Healthy runs whose completions grow
# with more of them cut, but bounded (to 10-20 %), in other shapes than set 13's; creeps to the cap from an
# already-capped start, late and exponential, and a jump then a creep.


def h14_lengths_grow_to_70pct(rng):
    """Healthy: completions grow from 6 to 45 tokens (of 64) over steps 30-250 and the capped share from 2 % to
    20 %; both then hold."""
    return _lengths_grow(rng, _ease(30, 1.0, 250), (6, 39), (0.02, 0.18))


def h14_lengths_linear_all_run(rng):
    """Healthy: completions creep linearly over the whole run from 10 to 40 tokens, the capped share 3 % -> 12 %."""
    return _lengths_grow(rng, _ease(0), (10, 30), (0.03, 0.09))


def h14_lengths_two_spurts(rng):
    """Healthy: completions grow in two spurts (steps 60-90 and 180-210) from 8 to 22 to 38 tokens, the capped
    share 2 % -> 8 % -> 14 %."""
    return _lengths_grow(rng, _ease(60, 1.0, 90) + _ease(180, 1.0, 210), (8, 15), (0.02, 0.06))


def h14_lengths_sqrt_growth(rng):
    """Healthy: completions grow as the square root of the time from 5 to 42 tokens, the capped share 1 % -> 18 %."""
    return _lengths_grow(rng, _ease(0, 0.5), (5, 37), (0.01, 0.17))


def r14_length_creep_from_capped(rng):
    """Completions at 35 tokens with 12 % capped creep linearly from the onset to 95 % of the cap, the capped share
    to 88 %; the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    x = _ease(ONSET)
    s["response_len"] = 35 + (0.95 * MAX_NEW - 35) * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.12 + 0.76 * x) / (P * G)
    return s


def r14_length_exp_late(rng):
    """Lengths grow exponentially from 6 tokens at step 190, doubling every ~17 steps, until 95 % of the cap; the
    capped share follows to 90 %; the accuracy falls from step 250."""
    s = _with_p(rng, _decline(0.6, 0.2, 100))
    t = np.arange(N, dtype=float)
    length = np.minimum(6 * np.exp(np.clip(t - 190, 0, None) / 25.0), 0.95 * MAX_NEW)
    s["response_len"] = length + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.9 * np.clip((length - 6) / (0.95 * MAX_NEW - 6), 0, 1)) / (P * G)
    s["_onset"] = np.array([190.0])
    return s


def r14_length_jump_then_creep(rng):
    """Lengths jump from 5 to 25 tokens at the onset (capped 2 % -> 15 %), then creep linearly to 95 % of the cap,
    the capped share to 85 %; the accuracy falls from 70 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    jump, x = (np.arange(N) >= ONSET).astype(float), _ease(ONSET)
    s["response_len"] = 5 + 20 * jump + (0.95 * MAX_NEW - 25) * x + 0.3 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.02 + 0.13 * jump + 0.7 * x) / (P * G)
    return s


REPORT14_SLOW = (r14_length_creep_from_capped, r14_length_exp_late, r14_length_jump_then_creep)
REPORT14_HEALTHY = (h14_lengths_grow_to_70pct, h14_lengths_linear_all_run, h14_lengths_two_spurts, h14_lengths_sqrt_growth)
REPORT14_SEEDS = range(14000, 14300)
SLOW_REPORT14_SEEDS = range(14000, 14020)

# Report set 15 (issue 22, ninth pass): declared after report set 14 was measured (its healthy runs whose lengths
# grow with a bounded share cut warned on 78 % of runs) and before length_drift's warning was changed for it (seeds
# 15000-15299; the pathologies' 15000-15019). Healthy growth whose cut share stays bounded (to 12-25 %) in other
# shapes again: logistic, one fast spurt, an overdispersed share, grow-shrink-grow; creeps to the cap that are
# logistic, a staircase, or that follow a healthy growth.


def _overdispersed(rng, p: np.ndarray) -> np.ndarray:
    """The share of P x G completions cut when prompts differ: each prompt's chance is Beta-distributed around p
    (concentration 4), and its G completions are cut or not together with it: [N]."""
    p = np.clip(p, 1e-3, 1 - 1e-3)
    q = rng.beta(4 * p[:, None], 4 * (1 - p[:, None]), size=(len(p), P))
    return rng.binomial(G, q).sum(axis=1) / (P * G)


def h15_lengths_logistic_25pct(rng):
    """Healthy: completions grow logistically (centred on step 140, scale 25 steps) from 8 to 48 tokens (of 64), the
    capped share from 2 % to 25 %; both then hold."""
    return _lengths_grow(rng, 1 / (1 + np.exp(-(np.arange(N) - 140) / 25)), (8, 40), (0.02, 0.23))


def h15_lengths_fast_spurt(rng):
    """Healthy: completions grow in one fast spurt over steps 100-125 from 10 to 32 tokens, the capped share 3 % ->
    12 %; both then hold."""
    return _lengths_grow(rng, _ease(100, 1.0, 125), (10, 22), (0.03, 0.09))


def h15_lengths_overdispersed_share(rng):
    """Healthy: completions grow linearly over steps 40-240 from 8 to 36 tokens, the capped share 2 % -> 14 %, cut
    by prompt (overdispersed: a hard prompt's whole group runs long)."""
    s = _healthy(rng)
    x = _ease(40, 1.0, 240)
    s["response_len"] = 8 + 28 * x + 0.8 * rng.standard_normal(N)
    s["truncation_rate"] = _overdispersed(rng, 0.02 + 0.12 * x)
    return s


def h15_lengths_grow_shrink_grow(rng):
    """Healthy: completions grow from 8 to 35 tokens by step 100, shorten to 25 by step 180, and grow to 40 by step
    280; the capped share 2 % -> 10 % -> 5 % -> 15 %."""
    s = _healthy(rng)
    a, b, c = _ease(0, 1.0, 100), _ease(100, 1.0, 180), _ease(180, 1.0, 280)
    s["response_len"] = 8 + 27 * a - 10 * b + 15 * c + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.02 + 0.08 * a - 0.05 * b + 0.10 * c) / (P * G)
    return s


def r15_length_logistic_to_cap(rng):
    """Completions grow logistically from the onset (centred 50 steps after it, scale 15 steps) from 10 tokens to 95 %
    of the cap, the capped share along to 90 %; the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    x = 1 / (1 + np.exp(-(np.arange(N) - ONSET - 50) / 15))
    x = np.clip((x - x[ONSET]) / (1 - x[ONSET]), 0, 1)
    s["response_len"] = 10 + (0.95 * MAX_NEW - 10) * x + 0.4 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.02 + 0.88 * x) / (P * G)
    return s


def r15_length_staircase(rng):
    """Completions step up toward the cap in three jumps, 40 steps apart from the onset (12 -> 28 -> 44 -> 60
    tokens), the capped share 3 % -> 30 % -> 60 % -> 90 % (overdispersed); the accuracy falls from 70 steps after
    the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    t = np.arange(N)
    k = sum((t >= ONSET + 40 * i).astype(float) for i in range(3))
    s["response_len"] = 12 + 16 * k + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = _overdispersed(rng, 0.03 + 0.29 * k)
    return s


def r15_length_creep_after_growth(rng):
    """A healthy growth (as h13_lengths_grow_more_capped: 5 -> 40 tokens, 1 % -> 15 % capped over steps 20-120), then
    from the onset a linear creep to 95 % of the cap, the capped share to 88 %; the accuracy falls from 70 steps
    after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    grow, creep = _ease(20, 1.0, 120), _ease(ONSET)
    s["response_len"] = 5 + 35 * grow + (0.95 * MAX_NEW - 40) * creep + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.01 + 0.14 * grow + 0.73 * creep) / (P * G)
    return s


REPORT15_SLOW = (r15_length_logistic_to_cap, r15_length_staircase, r15_length_creep_after_growth)
REPORT15_HEALTHY = (h15_lengths_logistic_25pct, h15_lengths_fast_spurt, h15_lengths_overdispersed_share,
                    h15_lengths_grow_shrink_grow)
REPORT15_SEEDS = range(15000, 15300)
SLOW_REPORT15_SEEDS = range(15000, 15020)

# Report set 16 (issue 22, tenth pass): declared after report set 15 was measured (a logistic cut share rising to 25 %
# went critical on 61 of its 300 healthy runs) and before the length forecast is changed for it (seeds 16000-16299;
# the pathologies' 16000-16019). Healthy growth whose cut share climbs steeply and stops (at 15-30 %): a fast
# logistic, a short ramp, a late logistic, two steps cut by prompt; creeps to the cap whose share lags the lengths
# further, a slow logistic, and a linear creep cut by prompt.


def h16_lengths_logistic_fast_15pct(rng):
    """Healthy: completions grow along a fast logistic (centred on step 110, 10 steps per e-fold) from 8 to 30 tokens
    (of 64), the capped share from 3 % to 15 %; both then hold."""
    return _lengths_grow(rng, _logistic(110, 10), (8, 22), (0.03, 0.12))


def h16_lengths_ramp_to_20pct(rng):
    """Healthy: completions grow linearly over steps 60-120 from 10 to 40 tokens, the capped share 2 % -> 20 %; both
    then hold."""
    return _lengths_grow(rng, _ease(60, 1.0, 120), (10, 30), (0.02, 0.18))


def h16_lengths_logistic_late_30pct(rng):
    """Healthy: completions grow along a late logistic (centred on step 210, 20 steps per e-fold) from 10 to 46 tokens,
    the capped share from 4 % to 30 %."""
    return _lengths_grow(rng, _logistic(210, 20), (10, 36), (0.04, 0.26))


def h16_lengths_two_steps_by_prompt(rng):
    """Healthy: completions grow in two logistic steps (at steps 90 and 200, 8 steps per e-fold) from 8 to 24 to 40
    tokens, the capped share 2 % -> 12 % -> 22 %, cut by prompt (overdispersed)."""
    s = _healthy(rng)
    x = 0.5 * _logistic(90, 8) + 0.5 * _logistic(200, 8)
    s["response_len"] = 8 + 32 * x + 0.6 * rng.standard_normal(N)
    s["truncation_rate"] = _overdispersed(rng, 0.02 + 0.20 * x)
    return s


def r16_length_share_lags_more(rng):
    """Lengths creep linearly from the onset to 95 % of the cap; the capped share lags them further than
    r13_length_share_lags' (cubic, to 90 %); the accuracy falls from 75 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 75))
    x = _ease(ONSET)
    s["response_len"] = 6 + (0.95 * MAX_NEW - 6) * x + 0.4 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.02 + 0.88 * x**3) / (P * G)
    return s


def r16_length_slow_logistic_to_cap(rng):
    """Lengths rise to 95 % of the cap along a slow logistic centred 70 steps after the onset (25 steps per e-fold),
    the capped share along to 90 %; the accuracy falls from 70 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    rise = _logistic(ONSET + 70, 25)
    x = np.clip((rise - rise[ONSET]) / (1 - rise[ONSET]), 0, 1)  # 0 at the onset
    s["response_len"] = 8 + (0.95 * MAX_NEW - 8) * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.03 + 0.87 * x) / (P * G)
    return s


def r16_length_creep_by_prompt(rng):
    """Lengths creep linearly from the onset from 12 tokens to 95 % of the cap, the capped share 5 % -> 88 % cut by
    prompt (overdispersed); the accuracy falls from 60 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 60))
    x = _ease(ONSET)
    s["response_len"] = 12 + (0.95 * MAX_NEW - 12) * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = _overdispersed(rng, 0.05 + 0.83 * x)
    return s


REPORT16_SLOW = (r16_length_share_lags_more, r16_length_slow_logistic_to_cap, r16_length_creep_by_prompt)
REPORT16_HEALTHY = (h16_lengths_logistic_fast_15pct, h16_lengths_ramp_to_20pct, h16_lengths_logistic_late_30pct,
                    h16_lengths_two_steps_by_prompt)
REPORT16_SEEDS = range(16000, 16300)
SLOW_REPORT16_SEEDS = range(16000, 16020)


# Report set 17 (issue 22, eleventh pass): declared after the horizon's frontier was measured on sets 1-16 (bench_lead_time
# --set forecast_windows=3..10) and before the default horizon changes (seeds 17000-17299; the pathologies' 17000-17019).
# Healthy rises that stop, which a forecast continues: a cut share to 35 %, two ramps cut by prompt, a logistic KL to
# 0.3, a KL ramp that stops; creeps to the cap and KL exponentials of other shapes.


def h17_lengths_logistic_35pct(rng):
    """Healthy: completions grow along a logistic (centred on step 160, 15 steps per e-fold) from 8 to 44 tokens (of 64),
    the capped share from 3 % to 35 %; both then hold."""
    return _lengths_grow(rng, _logistic(160, 15), (8, 36), (0.03, 0.32))


def h17_lengths_two_ramps_by_prompt(rng):
    """Healthy: completions grow in two linear ramps (steps 80-110 and 200-230) from 8 to 22 to 36 tokens, the capped
    share 2 % -> 14 % -> 26 %, cut by prompt (overdispersed)."""
    s = _healthy(rng)
    x = 0.5 * _ease(80, 1.0, 110) + 0.5 * _ease(200, 1.0, 230)
    s["response_len"] = 8 + 28 * x + 0.6 * rng.standard_normal(N)
    s["truncation_rate"] = _overdispersed(rng, 0.02 + 0.24 * x)
    return s


def h17_kl_logistic_to_0p3(rng):
    """Healthy: the KL rises along a logistic curve (0.02 -> 0.3, centred at step 170, 12 steps per e-fold) and settles."""
    return _kl_follows(_healthy(rng), 0.02 + 0.28 * _logistic(170, 12), rng)


def h17_kl_ramp_then_flat(rng):
    """Healthy: the KL rises linearly from 0.01 to 0.25 over steps 50-150, then holds."""
    return _kl_follows(_healthy(rng), 0.01 + 0.24 * _ease(50, 1.0, 150), rng)


def r17_length_quadratic_creep(rng):
    """Lengths creep quadratically from the onset to 95 % of the cap, the capped share along x^1.5 to 90 %; the accuracy
    falls from 70 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 70))
    x = _ease(ONSET, 2.0)
    s["response_len"] = 8 + (0.95 * MAX_NEW - 8) * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = rng.binomial(P * G, 0.02 + 0.88 * np.sqrt(x) ** 3) / (P * G)
    return s


def r17_length_creep_from_10pct_cut_by_prompt(rng):
    """A run already cutting 10 % of its completions (30 tokens long) creeps linearly from the onset to 95 % of the cap, the
    capped share to 85 %, cut by prompt (overdispersed); the accuracy falls from 65 steps after the onset."""
    s = _with_p(rng, _decline(0.6, 0.2, 65))
    x = _ease(ONSET)
    s["response_len"] = 30 + (0.95 * MAX_NEW - 30) * x + 0.5 * rng.standard_normal(N)
    s["truncation_rate"] = _overdispersed(rng, 0.10 + 0.75 * x)
    return s


def r17_kl_exp_25(rng):
    """KL grows exponentially from the onset, doubling every ~25 steps from 0.01 (~0.6 at the end); the accuracy falls
    from 80 steps after the onset."""
    return _kl_exp_after_onset(rng, 0.01, 36.0, 80)


def r17_kl_exp_18_on_0p05(rng):
    """A KL flat at 0.05 grows exponentially from the onset, doubling every ~18 steps from 0.005 (~1.6 at the end); the
    accuracy falls from 65 steps after the onset."""
    s = _kl_exp_after_onset(rng, 0.005, 26.0, 65)
    s["kl"] = s["kl"] + 0.05
    return s


REPORT17_SLOW = (r17_length_quadratic_creep, r17_length_creep_from_10pct_cut_by_prompt, r17_kl_exp_25, r17_kl_exp_18_on_0p05)
REPORT17_HEALTHY = (h17_lengths_logistic_35pct, h17_lengths_two_ramps_by_prompt, h17_kl_logistic_to_0p3,
                    h17_kl_ramp_then_flat)
REPORT17_SEEDS = range(17000, 17300)
SLOW_REPORT17_SEEDS = range(17000, 17020)

REPORT4_SLOW = (r4_length_sigmoid, r4_length_noisy_creep, r4_kl_linear_then_exp, r4_kl_exp_elevated,
                r4_loss_exp_late_fast, r4_loss_exp_heavy_base, r4_entropy_step_creep, r4_format_slow_rise)
REPORT4_HEALTHY = (h4_loss_sqrt_x10, h4_loss_t2, h4_entropy_dip_recover, h4_kl_jump_settle, h4_lengths_shrink,
                   h4_late_learner)
REPORT4_SEEDS = range(4000, 4300)
SLOW_REPORT4_SEEDS = range(4000, 4020)

SEEN_HEALTHY = (healthy_t3_loss, healthy_growing_loss, healthy_plateau_rise, healthy_noisy_eval)
REPORT_HEALTHY = (report_t3_growing, report_t3_noisy, report_growing_x10, report_plateau_60, report_plateau_150,
                  report_noisy_eval_30)
FIT_SEEDS, REPORT_SEEDS = range(0, 300), range(1000, 1300)


# generator -> (conditions that must fire, conditions that must not)
ZOO = {
    healthy: (set(), {"critical"}),
    healthy_optimizer: (set(), {"critical"}),
    adv_mean_drift: ({"adv_mean_drift"}, set()),
    nonfinite: ({"nonfinite"}, set()),
    reward_saturated: ({"reward_saturated"}, {"critical"}),
    signal_vanished: ({"signal_vanished"}, {"reward_saturated"}),
    kl_runaway: ({"kl_runaway"}, set()),
    kl_dominant: ({"kl_dominant", "signal_vanished"}, set()),
    entropy_collapse: ({"entropy_collapse"}, {"critical"}),
    entropy_blowup: ({"entropy_blowup"}, set()),
    exploration: ({"exploration"}, {"critical"}),
    late_degradation: ({"late_degradation"}, {"reward_hacking"}),
    reward_hacking: ({"reward_hacking"}, {"late_degradation"}),
    loss_spike: ({"loss_spike"}, {"critical", "kl_only_learning"}),  # a spike is not a falling loss
    loss_catastrophe: ({"loss_spike"}, {"kl_only_learning"}),  # critical: four orders of magnitude in one update
    policy_collapse: ({"policy_collapse"}, set()),
    capped_unrewarded: ({"length_capped"}, set()),
    healthy_bf16_mismatch: (set(), {"critical", "train_inference_mismatch"}),
    mismatch_growth: ({"train_inference_mismatch"}, set()),
    sampler_desync: ({"train_inference_mismatch"}, set()),
    # Lengths creeping to the cap, 90 % cut by the end: length_drift's warning held while it worsens is
    # escalated to critical (cut answers are not graded; this generator leaves the accuracy alone, which
    # a real run would not: relabelled from "no critical" with the escalation, docs/explanation/lead-time.md).
    length_pathology: ({"length_pathology"}, {"length_capped"}),
    plateau_kl_flat: ({"plateau_kl_flat"}, {"critical"}),
    plateau_small_group: ({"plateau_small_group"}, {"critical"}),
    plateau_grader_loose: ({"plateau_grader_loose"}, {"critical"}),
    kl_only_learning: ({"kl_only_learning"}, {"critical"}),
    healthy_format: (set(), {"critical", "correctness_drop"}),
    loss_blowup: ({"loss_blowup"}, set()),
    kl_acceleration: ({"kl_acceleration"}, set()),
    entropy_drift: ({"entropy_drift"}, set()),
    length_drift: ({"length_drift"}, set()),
    format_hacking: ({"correctness_drop", "reward_hacking"}, set()),
    no_progress: ({"no_progress"}, {"critical"}),
    zero_gradient: ({"zero_gradient"}, set()),
    kl_offset: ({"kl_offset"}, {"critical"}),
    grad_norm_spike: ({"grad_norm_spike"}, {"critical"}),
    clip_imbalance: ({"clip_imbalance"}, {"critical"}),
    length_capped: ({"length_capped"}, set()),
    repetition: ({"repetition"}, set()),
}
HEALTHY = (healthy, healthy_format, healthy_optimizer)
FIT_HEALTHY = HEALTHY + SEEN_HEALTHY
FROM_START = (
    reward_saturated,
    plateau_kl_flat,
    plateau_small_group,
    plateau_grader_loose,
    no_progress,
    kl_offset,
    capped_unrewarded,
)  # no onset: there all along


def truth(gen, seed: int = 0) -> tuple[int | None, int | None]:
    """(onset step, damage step) of a generator's run: the damage is the first step where the
    noise-free held-out accuracy is 10 % below its running peak (None if it never is)."""
    s = gen(np.random.default_rng(seed))
    acc = s["_acc_true"]
    peak = np.maximum.accumulate(acc)
    hit = np.flatnonzero(acc < 0.9 * peak)
    onset = None if gen in HEALTHY else 0 if gen in FROM_START else int(s.get("_onset", [ONSET])[0])
    return onset, (int(s["step"][hit[0]]) if len(hit) else None)


def make(gen, seed: int) -> RunLog:
    s = gen(np.random.default_rng(seed))
    g = int(s.pop("_group_size", [G])[0])
    eval_n = int(s.pop("_eval_n", [EVAL_N])[0])
    series = {k: np.asarray(v, dtype=float) for k, v in s.items() if k == "_nonfinite" or not k.startswith("_")}
    aux = [k for k in series if k.startswith("reward_") and k != "reward_correct"]
    if aux:
        series["reward_aux"] = np.sum([series[k] for k in aux], axis=0)
    return RunLog(series, f"zoo:{gen.__name__}", "sentinel", group_size=g, max_new_tokens=MAX_NEW,
                  max_reward=1.0 + len(aux), ln_vocab=float(np.log(15)), eval_n=eval_n, completions_per_step=P * G)
