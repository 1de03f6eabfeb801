"""Reward functions and the scoring contract.

A reward function is `fn(completion: str, answer: str, prompt: str) -> float`, called once per
completion, so one bad sample can only ever spoil itself. A call that raises, or returns None,
NaN, +-inf or a non-number, is *invalid*: counted by kind, and then either excluded from its
group's statistics (advantage 0, no loss) or replaced by a configured fallback. It never
crashes the run and never silently zeroes a whole group.
"""

from __future__ import annotations

import importlib
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from grpo_sentinel.service.config import GRPOSettings, RewardSpec
from grpo_sentinel.service.data import Verifier

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str, str], float]
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _correct(verifier: Verifier) -> RewardFn:
    return lambda completion, answer, prompt: float(verifier.is_correct(completion, answer))


def _format(verifier: Verifier) -> RewardFn:
    """1 if the completion is a well-formed answer (a bare number, or has a \\boxed{}), right or wrong."""
    if verifier.name == "boxed":
        return lambda completion, answer, prompt: float(verifier.extract(completion) is not None)
    return lambda completion, answer, prompt: float(_PLAIN_NUMBER.fullmatch(completion.strip()) is not None)


BUILTIN: dict[str, Callable[[Verifier], RewardFn]] = {"correct": _correct, "format": _format}


def import_function(name: str) -> RewardFn:
    """'package.module:function' -> the function; ValueError saying what is wrong."""
    module, _, attr = name.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"cannot import reward function {name!r}: {e}") from None
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable")
    return fn


def resolve(spec: RewardSpec, verifier: Verifier) -> RewardFn:
    return BUILTIN[spec.name](verifier) if spec.name in BUILTIN else import_function(spec.name)


@dataclass(frozen=True)
class Scores:
    reward: np.ndarray  # [N] combined reward; NaN where the sample is excluded
    components: dict[str, np.ndarray]  # name -> [N] raw values, NaN where invalid
    correct: np.ndarray  # [N] bool, the verifier's verdict (independent of the reward weights)
    valid: np.ndarray  # [N] bool, the sample takes part in its group's statistics and the loss
    invalid: Counter  # kind ("error", "none", "nan", "inf", "type") -> count, over all functions


class RewardScorer:
    def __init__(self, specs: Sequence[RewardSpec], verifier: Verifier, cfg: GRPOSettings):
        self.specs = list(specs)
        self.fns = [resolve(s, verifier) for s in self.specs]
        self.verifier = verifier
        self.fallback = cfg.reward_fallback if cfg.invalid_reward == "fallback" else None
        self._reported: set[tuple[str, str]] = set()  # (function, kind) already logged once

    def score(self, completions: Sequence[str], answers: Sequence[str], prompts: Sequence[str]) -> Scores:
        n = len(completions)
        invalid: Counter = Counter()
        combined = np.zeros(n)
        ok = np.ones(n, dtype=bool)
        components = {}
        for spec, fn in zip(self.specs, self.fns):
            values = np.full(n, np.nan)
            for i in range(n):
                value, kind = self._call(spec.name, fn, completions[i], answers[i], prompts[i])
                if kind is None:
                    values[i] = value
                else:
                    invalid[kind] += 1
                    ok[i] &= self.fallback is not None
            components[spec.name] = values
            filled = values if self.fallback is None else np.where(np.isnan(values), self.fallback, values)
            combined += spec.weight * filled
        combined[~ok] = np.nan
        correct = np.array([self.verifier.is_correct(c, a) for c, a in zip(completions, answers)], dtype=bool)
        return Scores(reward=combined, components=components, correct=correct, valid=ok, invalid=invalid)

    def _call(self, name: str, fn: RewardFn, completion: str, answer: str, prompt: str) -> tuple[float, str | None]:
        try:
            value = fn(completion, answer, prompt)
        except Exception as e:  # noqa: BLE001 - the contract: a failing grader spoils one sample, not the run
            self._report_once(name, "error", f"raised {type(e).__name__}: {e}")
            return math.nan, "error"
        if value is None:
            kind = "none"
        elif not isinstance(value, (int, float, np.floating, np.integer)):  # bools count as 0/1
            kind = "type"
        elif math.isnan(value):
            kind = "nan"
        elif math.isinf(value):
            kind = "inf"
        else:
            return float(value), None
        self._report_once(name, kind, f"returned {value!r}")
        return math.nan, kind

    def _report_once(self, name: str, kind: str, what: str) -> None:
        if (name, kind) not in self._reported:
            self._reported.add((name, kind))
            log.warning("reward %r %s; sample treated as invalid (further cases are only counted)", name, what)
