"""Online health: the offline detectors, run on the series the trainer has produced so far.

The monitor only reads StepStats and returns a Verdict; acting on it (stop, halt, keep a
last-healthy checkpoint) is the trainer's job, so telemetry never reaches into the trainer.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import numpy as np

from grpo_sentinel.telemetry.health.detectors import Condition, Thresholds, diagnose
from grpo_sentinel.telemetry.health.ingest import RunLog
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


@dataclass
class HealthMonitor:
    stop_on: frozenset[str] = frozenset({"reward_saturated"})  # end the run cleanly (a success: keep the checkpoint)
    halt_on: frozenset[str] = frozenset({"adv_mean_drift"})  # end the run as broken
    thresholds: Thresholds = field(default_factory=Thresholds)
    group_size: int | None = None  # G: plateau_small_group is not assessable without it
    _rows: dict[str, list[float]] = field(default_factory=dict)
    _last_seen: dict[str, int] = field(default_factory=dict)  # condition -> last step it was active
    _info: RunInfo | None = None
    _baseline_acc: float | None = None

    def start(self, info: RunInfo) -> None:
        self._info = info

    def seed(self, log: RunLog) -> None:
        """History from the run record, so a resumed run's windows and baselines continue."""
        self._rows = {k: v.tolist() for k, v in log.series.items()}
        self._baseline_acc = log.baseline_acc

    def baseline(self, sample_acc: float) -> None:
        """The step-0 evaluation: the reference every later accuracy is compared with."""
        self._baseline_acc = sample_acc

    def _append(self, row: dict) -> None:
        length = len(self._rows.get("step", []))
        for k, v in row.items():
            if isinstance(v, (int, float)):
                self._rows.setdefault(k, [math.nan] * length).append(float(v))
        for v in self._rows.values():  # columns this row lacks
            if len(v) == length:
                v.append(math.nan)

    def observe(self, s: StepStats) -> Verdict:
        row = s.row()
        row["_nonfinite"] = float(s.skipped == "nonfinite")
        self._append(row)
        series = {k: np.asarray(v) for k, v in self._rows.items()}
        sc = self._info.scales if self._info else None
        runlog = RunLog(series, "online", "sentinel", group_size=self.group_size, max_reward=sc.max_reward if sc else 1.0,
                        ln_vocab=sc.ln_vocab if sc else None, max_new_tokens=sc.max_new_tokens if sc else None,
                        eval_n=s.eval.n if s.eval else self._eval_n(), baseline_acc=self._baseline_acc)
        diag = diagnose(runlog, self.thresholds)
        active = tuple(c for c in diag.conditions if c.last_step == s.step)
        # Hysteresis: a condition that flickers off and on within one window is the same episode.
        w = self.thresholds.window
        new = tuple(c for c in active if s.step - self._last_seen.get(c.id, -10**9) > w)
        self._last_seen.update({c.id: s.step for c in active})
        for c in new:
            log.log(logging.WARNING if c.severity != "info" else logging.INFO,
                    "health: %s %s since step %d: %s | cause: %s | action: %s",
                    c.severity.upper(), c.id, c.first_step, c.evidence, c.cause, c.action)
        ids = {c.id for c in active}
        for action, wanted in (("halt", self.halt_on), ("stop", self.stop_on)):  # halting wins
            if ids & wanted:
                return Verdict(active, new, action, min(ids & wanted), diag.entropy_baseline)
        return Verdict(active, new, entropy_baseline=diag.entropy_baseline)

    def _eval_n(self) -> int | None:
        n = [x for x in self._rows.get("eval_n", []) if not math.isnan(x)]
        return int(n[-1]) if n else None
