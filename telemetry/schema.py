"""The one typed per-step record. Computed once per step on the host; the run record (CSV),
the OpenTelemetry exporter and the health monitor all read this and nothing else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Annotated

import numpy as np
from pydantic import Field  # the ranges a persisted Scales must hold (runfiles.read_run_info checks them)


@dataclass(frozen=True)
class Scales:
    """Run constants that bound the metrics (histogram buckets, normalisations) and size the health
    detectors. Persisted with the RunInfo in the run directory's run.json (telemetry/runfiles.py):
    what `diagnose` reads of a run besides its record. telemetry/session.py derives them once."""

    max_reward: Annotated[float, Field(gt=0)]  # largest combined reward (session.max_reward)
    ln_vocab: Annotated[float, Field(gt=0)]  # the entropy ceiling ln V
    max_new_tokens: Annotated[int, Field(ge=1)]  # the completion cap
    group_size: Annotated[int, Field(ge=1)] | None = None  # G, completions per prompt (None: not known)
    # New prompts per optimizer step (TRL: completions per step / G, which need not be whole).
    prompts_per_step: Annotated[float, Field(gt=0)] | None = None
    window: Annotated[int, Field(ge=2)] | None = None  # the detectors' window in record rows (health.thresholds.detector_window)
    reward_weights: dict[str, float] = field(default_factory=dict)  # reward function -> weight, in the record's order
    thresholds: dict[str, float] = field(default_factory=dict)  # detector thresholds the run changed (health.thresholds)


@dataclass(frozen=True)
class RunInfo:
    """Told to every sink once the model is loaded, before the first step; run.json keeps it."""

    run_id: str
    model: str
    loss_type: str
    scales: Scales
    attempt: int = 1  # how many times this run has been started (a resume is the next attempt)
    world_size: int = 1  # training processes (ranks); rank 0 reports for all
    sampling: dict[str, float] = field(default_factory=dict)  # temperature, top_p, max_new_tokens
    # What biases the train/inference mismatch (the health row's evidence names it): backend (hf | vllm | trl),
    # sampler_dtype, trainer_dtype, ratio (raw | masked: after a correction truncated or masked it)
    sampler: dict[str, str] = field(default_factory=dict)
    traces_project: str | None = None  # the Langfuse project of the run's traces (traces.project_id), for links


@dataclass(frozen=True)
class Samples:
    """Per-completion values of one step (B = prompts x G), for distributions and traces."""

    reward: np.ndarray  # [B] combined reward, NaN where the sample was excluded (invalid reward)
    components: dict[str, np.ndarray]  # reward function -> [B], NaN where it was invalid
    advantage: np.ndarray  # [B], 0 for excluded samples
    correct: np.ndarray  # [B] bool
    length: np.ndarray  # [B] completion tokens, EOS included
    truncated: np.ndarray  # [B] bool
    kl: np.ndarray  # [B] token-mean k3 KL of each completion (0 when beta = 0)
    entropy: np.ndarray  # [B] token-mean entropy of each completion
    group_reward_std: np.ndarray  # [P] unbiased std of each group's valid rewards
    # The texts behind the numbers (traces show them): prompts and answers per group, completions
    # per sample. Empty where the producer has no text (e.g. a log that kept only numbers).
    prompts: tuple[str, ...] = ()  # [P] as fed to the model (template applied)
    answers: tuple[str, ...] = ()  # [P] reference answers
    completions: tuple[str, ...] = ()  # [B] decoded completions
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [P]
    # |log p_trainer - log p_sampler| of every completion token, flat [tokens] (the mismatch's distribution)
    logp_diff: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # Per-completion fields the producer could not measure (a trainer that is not ours, e.g. TRL, has no
    # per-completion KL or entropy): their arrays are placeholders (NaN, False), and what reads them
    # leaves them out (no histogram, no trace metadata) instead of reporting the placeholder.
    unmeasured: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Generations:
    """One completion per prompt with its verdict: a held-out round in one sampling mode."""

    completions: tuple[str, ...]  # [n]
    correct: np.ndarray  # [n] bool
    tokens: np.ndarray  # [n] completion tokens, EOS included


@dataclass(frozen=True)
class Eval:
    """Held-out evaluation at a sampling point (step 0 = baseline)."""

    sample_acc: float  # completions sampled at the training temperature, fixed seed
    greedy_acc: float
    n: int  # subset size: the standard error of sample_acc is sqrt(p(1-p)/n)
    prompts: tuple[str, ...] = ()  # [n] the held-out prompts (for traces), with their answers
    answers: tuple[str, ...] = ()
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0))  # [n]
    generations: dict[str, Generations] = field(default_factory=dict)  # "sampled" / "greedy" -> [n]

    def accuracy(self) -> dict[str, float | int]:
        """The figures a summary keeps (the texts are in the traces)."""
        return {"sample_acc": self.sample_acc, "greedy_acc": self.greedy_acc, "n": self.n}


@dataclass(frozen=True)
class RankStats:
    """One training process's share of a step, for seeing a straggler."""

    rank: int
    step_time: float  # s, this rank's whole step
    wait: float  # s inside the step's explicit collectives: waiting for the slowest rank, then the transfer
    peak_memory: float  # bytes: the CUDA allocator's peak, else the process's peak resident set


@dataclass(frozen=True)
class TraceRef:
    """A trace of this step's generations: which ones, why, and its (deterministic) Langfuse id."""

    kind: str  # train (index = group) | eval (index = held-out prompt)
    index: int
    trace_id: str  # 32 hex digits
    reason: str  # sampled | a health condition it explains ("signal_vanished: all-same group", ...)


@dataclass(frozen=True)
class StepStats:
    """One optimizer step. Means are over the step's completions unless the name says tokens."""

    step: int
    reward: float  # mean combined reward over valid completions
    kl: float  # token-masked mean k3 KL to the reference (NaN when beta = 0: not measured)
    loss: float  # the loss actually back-propagated (mean over mu iterations)
    entropy: float  # token-masked mean entropy, un-tempered float32 logits
    entropy_norm: float  # entropy / ln(V): 1 is a uniform distribution over the vocabulary
    adv_mean: float  # must be ~0 (sentinel)
    adv_std: float  # unbiased; <= 1 under group scaling
    frac_zero_std: float  # groups with no learning signal (all valid rewards equal)
    frac_zero_std_correct: float  # ... of which every completion was correct
    frac_zero_std_wrong: float  # ... of which every completion was wrong
    train_acc: float  # fraction of the step's completions the verifier accepts
    response_len: float  # mean completion tokens, all completions
    response_len_correct: float  # NaN if none correct
    response_len_wrong: float  # NaN if none wrong
    truncation_rate: float  # fraction that hit max_new_tokens without EOS
    repetition: float  # mean over completions of seq-rep-4: the share of a completion's word 4-grams repeating an earlier one
    clip_frac: float  # fraction of tokens where the ratio clip was active
    grad_norm: float  # total norm before clipping
    lr: float
    step_time: float  # seconds, rollout to optimizer step
    tokens_per_s: float  # completion tokens generated per second of step time
    invalid_rewards: int  # reward calls that raised or gave None/NaN/inf this step
    skipped: str = ""  # why the update was skipped ('nonfinite', 'no_scored_samples'), else ''
    # Optimizer steps this record covers: 1 here; a trainer that logs every k steps (TRL's logging_steps)
    # gives means over its k steps, and a record of an evaluation alone covers 0.
    steps_in_row: int = 1
    # The train/inference mismatch: the sampler's log-prob of each sampled token against the trainer's (its logp_old,
    # the weights that sampled it), over completion tokens. NaN: not measured.
    mismatch_kl: float = math.nan  # token mean of k3 = r - log r - 1, r = p_trainer / p_sampler: KL(sampler || trainer)
    logp_diff_mean: float = math.nan  # token mean of |log p_trainer - log p_sampler|
    logp_diff_max: float = math.nan
    is_ratio_min: float = math.nan  # r per token, raw: before any correction
    is_ratio_mean: float = math.nan
    is_ratio_max: float = math.nan
    is_masked_frac: float = math.nan  # share of tokens the correction truncated or masked (0 without one)
    reward_components: dict[str, float] = field(default_factory=dict)  # function -> mean over valid values
    eval: Eval | None = None  # set on sampling steps
    health: tuple[str, ...] = ()  # ids of the health conditions active at this step (online monitor)
    health_new: tuple[str, ...] = ()  # ... of which these began an episode at this step
    health_critical: tuple[str, ...] = ()  # ... of which these are at critical severity now (Row.stages)
    entropy_baseline: float = math.nan  # the monitor's early-entropy baseline (NaN until known)
    traces: tuple[TraceRef, ...] = ()  # the generations of this step sent to Langfuse (telemetry/traces.py)
    ranks: tuple[RankStats, ...] = ()  # each training process's share (one entry per rank)
    samples: Samples | None = field(default=None, repr=False)
    # The float fields that are NaN because nothing measured them (`partial`), as opposed to a measured
    # value that overflowed: only the latter counts as non-finite (catalogue.nonfinite_signals).
    unmeasured: frozenset[str] = frozenset()

    @classmethod
    def partial(cls, step: int, **known) -> StepStats:
        """A record of what is known at `step`, every other measurement NaN (not measured): the step-0
        baseline, or a trainer that logs only some of the signals."""
        measurements = cls.scalar_fields()  # not the monitor's outputs (entropy_baseline): it sets them later
        missing = {f.name: math.nan for f in fields(cls) if f.type == "float" and f.name in measurements
                   and f.name not in known}
        return cls(step=step, **{"invalid_rewards": 0, "unmeasured": frozenset(missing), **missing, **known})

    @classmethod
    def scalar_fields(cls) -> list[str]:
        """The per-step scalars of the run record (the monitor's outputs and the nested parts are not)."""
        nested = ("reward_components", "eval", "samples", "health", "health_new", "health_critical", "entropy_baseline",
                  "traces", "ranks", "unmeasured")
        return [f.name for f in fields(cls) if f.name not in nested]

    def row(self) -> dict[str, float | int | str]:
        """Flat CSV/metric row: scalar fields, then `reward_<fn>` columns, then the eval columns and health."""
        out: dict[str, float | int | str] = {name: getattr(self, name) for name in self.scalar_fields()}
        out.update({f"reward_{k}": v for k, v in self.reward_components.items()})
        ev = self.eval
        out.update(sample_acc=ev.sample_acc if ev else math.nan, greedy_acc=ev.greedy_acc if ev else math.nan,
                   eval_n=ev.n if ev else "", health=" ".join(self.health),
                   # The explaining groups first (telemetry/traces.py orders them), so the first id
                   # of a condition's first step opens the generations behind it.
                   trace_ids=" ".join(t.trace_id for t in self.traces if t.kind == "train"),
                   eval_trace_id=next((t.trace_id for t in self.traces if t.kind == "eval"), ""))
        return out
