"""The one shape every run log is read into (ingest.py's readers write it; the detectors, the
online monitor and the report read it), and the words for what a reward component pays for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RunLog:
    series: dict[str, np.ndarray]  # name -> [N] float, NaN where missing; always has "step"
    source: str
    format: str
    group_size: int | None = None
    completions_per_step: int | None = None
    window: int | None = None  # detector window the run's config set (health.window), if any
    thresholds: dict[str, float] = field(default_factory=dict)  # detector thresholds it changed (health.thresholds)
    max_new_tokens: int | None = None
    max_reward: float = 1.0
    ln_vocab: float | None = None
    eval_n: int | None = None
    baseline_acc: float | None = None  # held-out accuracy before training (step 0), if known
    kl_signed: bool = False  # the KL column has negative values: a signed estimator (k1), not k3
    reward_scale_known: bool = True  # max_reward is the real maximum (config, or a 0/1 reward that never exceeds 1)
    reward_is_correctness: bool = True  # no auxiliary or unclassified component is summed into the reward
    traces: dict[int, str] = field(default_factory=dict)  # step -> its first Langfuse trace (the explaining group)
    trace_project: str | None = None  # the run's traces.project_id, for links
    # What biases the train/inference mismatch: the sampler's backend and precision, the trainer's, and whether the
    # logged ratio is raw or already truncated/masked (RunInfo.sampler; a TRL log: after its masking)
    sampler: dict[str, str] = field(default_factory=dict)
    sampling: dict[str, float] = field(default_factory=dict)  # temperature, top_p (RunInfo.sampling)
    notes: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)  # the log's columns read ("key -> our name", or the name)
    ignored: list[str] = field(default_factory=list)  # the log's columns not read, each with the reason
    unread: list[str] = field(default_factory=list)  # ... of which those holding numbers no name of ours matched

    def has(self, name: str) -> bool:
        return name in self.series and bool(np.isfinite(self.series[name]).any())

    def __len__(self) -> int:
        return len(self.series["step"])


# A component that judges the answer: saturation and hacking are read on it.
CORRECTNESS = re.compile(r"correct|accura|\bacc\b|_acc|acc_|verif|exact|math|answer|pass|solve|score", re.I)
# A component that pays for form, not for the answer (the names of TRL's, Unsloth's, open-r1's and the
# book's reward functions): summed into reward_aux. A name that is neither is "unclassified": it is read,
# said, and summed nowhere (it may be the run's actual objective).
AUXILIARY = re.compile(r"format|xml|tag|think|length|len_|_len|style|int_reward|\bint\b|strict|soft|cosine|repet|"
                       r"penalt|overlong|json|syntax|count|lang", re.I)


def component_kind(fn: str) -> str:
    """correctness | auxiliary | unclassified: what a reward component's name says it pays for. "format"
    outranks the correctness words: match_format_exactly (Unsloth's GRPO notebooks) pays for the exact form."""
    if "format" in fn.lower():
        return "auxiliary"
    return "correctness" if CORRECTNESS.search(fn) else "auxiliary" if AUXILIARY.search(fn) else "unclassified"
