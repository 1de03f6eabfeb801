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
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

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
    """'package.module:function' -> the function; ValueError saying what is wrong and what to do."""
    module, _, attr = name.partition(":")
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        hint = ""
        if e.name == module.split(".")[0] and ((Path.cwd() / f"{e.name}.py").is_file() or (Path.cwd() / e.name).is_dir()):
            hint = (f"; {e.name} is in the working directory, which is not on the import path: "
                    f"run with PYTHONPATH=. (or install it)")
        raise ValueError(f"cannot import reward function {name!r}: no module named {e.name!r}{hint}") from None
    except SyntaxError as e:
        raise ValueError(f"cannot import reward function {name!r}: syntax error in {e.filename}:{e.lineno}: {e.msg}") from None
    except Exception as e:  # noqa: BLE001 - whatever the module raises at import is the user's to see, in one line
        raise ValueError(f"cannot import reward function {name!r}: importing {module} raised "
                         f"{type(e).__name__}: {e}") from None
    fn = getattr(mod, attr, None)
    if fn is None:
        raise ValueError(f"cannot import reward function {name!r}: {module} has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward {name!r} is not callable")
    return fn


def _inline(fn: RewardFn, args: tuple[str, str, str]) -> tuple[str, object]:
    try:
        return "value", fn(*args)
    except Exception as e:  # noqa: BLE001 - see _Call
        return "error", e


def resolve(spec: RewardSpec, verifier: Verifier) -> RewardFn:
    return BUILTIN[spec.name](verifier) if spec.name in BUILTIN else import_function(spec.name)


@dataclass(frozen=True)
class Scores:
    reward: np.ndarray  # [N] combined reward; NaN where the sample is excluded
    components: dict[str, np.ndarray]  # name -> [N] raw values, NaN where invalid
    correct: np.ndarray  # [N] bool, the verifier's verdict (independent of the reward weights)
    valid: np.ndarray  # [N] bool, the sample takes part in its group's statistics and the loss
    invalid: Counter  # kind ("error", "timeout", "none", "nan", "inf", "type") -> count, over all functions


class StepAbandoned(Exception):
    """A stop was requested while the step still waited on reward calls: the step is dropped
    unrecorded (a resume redoes it exactly: its randomness comes from (seed, step))."""


class _Call(threading.Thread):
    """One call of a user's reward function, on a daemon thread: one that hangs is abandoned at its
    timeout and can hold up neither the step nor the process's exit."""

    def __init__(self, fn: RewardFn, args: tuple[str, str, str]):
        super().__init__(daemon=True, name="grpo-reward")
        self.fn, self.args = fn, args
        self.started_at = math.inf
        self.result: tuple[str, object] | None = None  # ("value", v) or ("error", exception)

    def run(self) -> None:
        self.started_at = time.monotonic()
        try:
            self.result = ("value", self.fn(*self.args))
        except Exception as e:  # noqa: BLE001 - the contract: a failing grader spoils one sample, not the run
            self.result = ("error", e)


class RewardScorer:
    def __init__(self, specs: Sequence[RewardSpec], verifier: Verifier, cfg: GRPOSettings,
                 stop: threading.Event | None = None):
        self.specs = list(specs)
        self.fns = [resolve(s, verifier) for s in self.specs]
        self.verifier = verifier
        self.fallback = cfg.reward_fallback if cfg.invalid_reward == "fallback" else None
        self.timeout, self.workers = cfg.reward_timeout_s, cfg.reward_workers
        self.stop = stop or threading.Event()  # set: abandon the step instead of waiting for its rewards
        self._reported: set[tuple[str, str]] = set()  # (function, kind) already logged once

    def score(self, completions: Sequence[str], answers: Sequence[str], prompts: Sequence[str]) -> Scores:
        n = len(completions)
        invalid: Counter = Counter()
        combined = np.zeros(n)
        ok = np.ones(n, dtype=bool)
        components = {}
        for spec, fn in zip(self.specs, self.fns):
            values = np.full(n, np.nan)
            args = list(zip(completions, answers, prompts))
            # Built-ins are ours and instant; a user's function may hang, so it runs timed.
            raw = [self._check(spec.name, *_inline(fn, a)) for a in args] if spec.name in BUILTIN \
                else self._timed(spec.name, fn, args)
            for i, (value, kind) in enumerate(raw):
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

    def _timed(self, name: str, fn: RewardFn, args: list[tuple[str, str, str]]) -> list[tuple[float, str | None]]:
        """Call fn on every sample, `workers` at a time; a call running longer than the timeout is
        invalid ('timeout'). A stop request abandons the step (StepAbandoned) instead of waiting."""
        calls = [_Call(fn, a) for a in args]
        pending, running, done = list(reversed(calls)), [], {}
        while pending or running:
            while pending and len(running) < self.workers:
                c = pending.pop()
                c.start()
                running.append(c)
            oldest = running[0]
            oldest.join(timeout=max(0.0, min(0.1, oldest.started_at + self.timeout - time.monotonic())))
            if self.stop.is_set():
                raise StepAbandoned(f"stop requested while reward {name!r} was running")
            for c in list(running):
                if c.result is not None:
                    done[id(c)] = self._check(name, *c.result)
                    running.remove(c)
                elif time.monotonic() - c.started_at > self.timeout:
                    self._report_once(name, "timeout", f"took longer than grpo.reward_timeout_s={self.timeout:g}s")
                    done[id(c)] = (math.nan, "timeout")
                    running.remove(c)  # abandoned: a daemon thread, it cannot hold up the exit
        return [done[id(c)] for c in calls]

    def _check(self, name: str, outcome: str, value) -> tuple[float, str | None]:
        """A call's outcome -> (reward, None) or (NaN, the kind of invalid value)."""
        if outcome == "error":
            self._report_once(name, "error", f"raised {type(value).__name__}: {value}")
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
