"""Online health: the offline detectors, one step at a time.

The detectors are causal and carry what they need from further back than a few windows (early
statistics, CUSUMs, peaks, recent evaluation points) in a state dict, so the monitor keeps only
the last `lookback(thresholds)` rows (and the run's first rows until its early statistics are
in) and judges the newest one: the cost of a step does not grow with the run, and the verdict is
the one `diagnose` gives on the whole log at that step (tests/test_monitor_streaming.py).

The monitor only reads StepStats and returns a Verdict; acting on it (stop, halt, keep a
last-healthy checkpoint) is the trainer's job, so telemetry never reaches into the trainer.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from grpo_sentinel.telemetry.health.detectors import Condition, diagnose
from grpo_sentinel.telemetry.health.runlog import CORRECTNESS, RunLog
from grpo_sentinel.telemetry.health.thresholds import Thresholds, lookback
from grpo_sentinel.telemetry.schema import RunInfo, StepStats

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    active: tuple[Condition, ...]  # conditions that hold at this step
    new: tuple[Condition, ...]  # ... of which these were not active at the previous step
    action: str = ""  # '' carry on | 'stop' end early as a success | 'halt' end as broken
    because: str = ""  # the condition that asked for the action
    entropy_baseline: float = math.nan  # the run's early entropy (exported, so alert rules can compare with it)

    @property
    def critical(self) -> bool:
        return any(c.severity == "critical" for c in self.active)

    def stamp(self, stats: StepStats) -> StepStats:
        """The step's record with this verdict on it, as every sink then sees it (any trainer's)."""
        return replace(stats, health=tuple(c.id for c in self.active), health_new=tuple(c.id for c in self.new),
                       health_critical=tuple(c.id for c in self.active if c.severity == "critical"),
                       entropy_baseline=self.entropy_baseline)


@dataclass
class HealthMonitor:
    stop_on: frozenset[str] = frozenset({"reward_saturated"})  # end the run cleanly (a success: keep the checkpoint)
    halt_on: frozenset[str] = frozenset({"adv_mean_drift"})  # end the run as broken
    thresholds: Thresholds = field(default_factory=Thresholds)
    group_size: int | None = None  # G: plateau_small_group is not assessable without it
    _rows: dict[str, deque] = field(default_factory=dict)  # the last `lookback` rows, by column
    _offset: int = 0  # rows of the run before the first kept one
    _state: dict = field(default_factory=dict)  # the detectors' carried state
    _episode: dict[str, int] = field(default_factory=dict)  # condition -> first step of its current episode
    _last_seen: dict[str, int] = field(default_factory=dict)  # condition -> last step it was active
    _info: RunInfo | None = None
    _baseline_acc: float | None = None
    _eval_n: int | None = None

    def start(self, info: RunInfo) -> None:
        self._info = info

    def seed(self, history: RunLog) -> None:
        """History from the run record, so a resumed run's windows, baselines and tests continue: one
        vectorised pass of the detectors over it leaves the state the steps would have left."""
        self._baseline_acc = history.baseline_acc
        if history.has("eval_n"):
            self._eval_n = int(np.nanmax(history.series["eval_n"]))
        self._state = {}
        diag = diagnose(self._runlog(history.series, history.eval_n or self._eval_n), self.thresholds, state=self._state)
        last = int(history.series["step"][-1]) if len(history) else 0
        for c in diag.conditions:
            self._last_seen[c.id] = max(self._last_seen.get(c.id, c.last_step), c.last_step)
            if c.last_step == last:
                self._episode[c.id] = c.first_step
        keep = self._keep()
        n = len(history)
        self._offset = max(0, n - keep)
        self._rows = {k: deque(v[self._offset:].tolist(), maxlen=None) for k, v in history.series.items()}

    def baseline(self, sample_acc: float) -> None:
        """The step-0 evaluation: the reference every later accuracy is compared with."""
        self._baseline_acc = sample_acc

    def _keep(self) -> int:
        return lookback(self.thresholds)

    def _append(self, row: dict) -> None:
        length = len(self._rows.get("step", ()))
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self._rows.setdefault(k, deque([math.nan] * length)).append(float(v))
        for v in self._rows.values():  # columns this row lacks
            if len(v) == length:
                v.append(math.nan)
        if length + 1 > self._keep():  # the early rows are in the state once the tail is this long
            for v in self._rows.values():
                v.popleft()
            self._offset += 1

    def _runlog(self, series: dict, eval_n: int | None) -> RunLog:
        sc = self._info.scales if self._info else None
        return RunLog(series, "online", "sentinel", group_size=self.group_size, max_reward=sc.max_reward if sc else 1.0,
                      ln_vocab=sc.ln_vocab if sc else None, max_new_tokens=sc.max_new_tokens if sc else None,
                      eval_n=eval_n, baseline_acc=self._baseline_acc, sampler=self._info.sampler if self._info else {},
                      sampling=self._info.sampling if self._info else {})

    def observe(self, s: StepStats) -> Verdict:
        row = s.row()
        row["_nonfinite"] = float(s.skipped == "nonfinite")
        if s.eval is not None:
            self._eval_n = s.eval.n
        aux = [v for k, v in s.reward_components.items() if not CORRECTNESS.search(k)]
        if aux:  # as the ingester derives it from the record's reward_<fn> columns
            row["reward_aux"] = float(np.nansum(aux)) if np.isfinite(aux).any() else math.nan
        return self.judge(row)

    def judge(self, row: dict) -> Verdict:
        """One step's row (our steps.csv names, plus `_nonfinite`), judged against the run so far."""
        step = int(row["step"])
        self._append(row)
        series = {k: np.fromiter(v, float, len(v)) for k, v in self._rows.items()}
        n = len(series["step"])
        diag = diagnose(self._runlog(series, self._eval_n), self.thresholds, start=n - 1, state=self._state,
                        offset=self._offset)
        # Only the newest row is judged: every condition found holds at this step. Hysteresis: a
        # condition that flickers off and on within one window is the same episode.
        w = self.thresholds.window
        active, new = [], []
        for c in diag.conditions:
            begins = step - self._last_seen.get(c.id, -10**9) > w
            if begins:
                self._episode[c.id] = step
            c = Condition(c.id, c.severity, self._episode.get(c.id, step), step, c.evidence, c.cause, c.action)
            active.append(c)
            if begins:
                new.append(c)
            self._last_seen[c.id] = step
        active, new = tuple(active), tuple(new)
        for c in new:
            log.log(logging.WARNING if c.severity != "info" else logging.INFO,
                    "health: %s %s since step %d: %s | cause: %s | action: %s",
                    c.severity.upper(), c.id, c.first_step, c.evidence, c.cause, c.action)
        ids = {c.id for c in active}
        baseline = self._state.get("entropy_early", (math.nan, math.nan))[0]
        if "entropy_early" not in self._state and "entropy" in series:  # still forming: the median so far
            # (exported for the dashboard and the rules; no detector judges against it before it is fixed)
            e = series["entropy"][np.isfinite(series["entropy"])]
            baseline = float(np.median(e)) if len(e) else math.nan
        for action, wanted in (("halt", self.halt_on), ("stop", self.stop_on)):  # halting wins
            if ids & wanted:
                return Verdict(active, new, action, min(ids & wanted), baseline)
        return Verdict(active, new, entropy_baseline=baseline)
