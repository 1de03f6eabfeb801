"""Lead time: how long before the damage a run was paged. Damage, as a user sees it, needs a drop
beyond its own noise (k standard errors of the evaluation, or of the reward's moving mean, labelled a
proxy), and the lead is known only to the resolution of the evaluation interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from grpo_sentinel.telemetry.health.detectors import Diagnosis
from grpo_sentinel.telemetry.health.runlog import RunLog
from grpo_sentinel.telemetry.health.thresholds import Thresholds
from grpo_sentinel.telemetry.stats import diff_noise, moving_average


@dataclass(frozen=True)
class Lead:
    """First warning, first critical, the damage step and the lead (damage - first critical, in steps;
    positive = paged before the damage). Damage, as a user sees it: the first evaluation point where
    held-out accuracy sits `DAMAGE` (10 %, relative) below its running peak *and* `DAMAGE_SE` (2)
    standard errors of a difference of two evaluations below it; in a log without evaluations, a
    proxy: the first step where the reward's 2w moving mean does (its standard error from the
    reward's own step-to-step noise). The damage is only known to lie between the evaluation before
    it and its own (`resolution` steps): the lead is an interval, `lead_range`."""
    first_warning: int | None
    warning: str
    first_critical: int | None
    critical: str
    damage_step: int | None
    damage: str  # what the damage was, in words
    resolution: int = 1  # steps between the damage step and the observation before it (the evaluation interval)
    proxy: bool = False  # the damage is read from the training reward, not from a held-out evaluation

    @property
    def lead(self) -> int | None:
        return None if self.damage_step is None or self.first_critical is None else self.damage_step - self.first_critical

    @property
    def lead_range(self) -> tuple[int, int] | None:
        """(least, most) steps the page came before the damage: the damage lies in (its step - resolution, its step]."""
        return None if self.lead is None else (self.lead - self.resolution + 1, self.lead)

    @property
    def warning_lead(self) -> int | None:
        return None if self.damage_step is None or self.first_warning is None else self.damage_step - self.first_warning

    def as_dict(self) -> dict:
        return {"first_warning": self.first_warning, "warning": self.warning, "first_critical": self.first_critical,
                "critical": self.critical, "damage_step": self.damage_step, "damage": self.damage, "lead": self.lead,
                "lead_range": list(self.lead_range) if self.lead_range else None, "resolution": self.resolution,
                "proxy": self.proxy, "warning_lead": self.warning_lead}


DAMAGE = 0.10
DAMAGE_SE = 2.0  # a damage stands out of its own noise by this many standard errors of a difference


def damage_step(log: RunLog, th: Thresholds = Thresholds()) -> tuple[int | None, str, int, bool]:
    """(damage step or None, words, resolution in steps, proxy?)."""
    s = log.series
    if log.has("sample_acc"):
        ok = np.isfinite(s["sample_acc"])
        steps, acc = s["step"][ok], s["sample_acc"][ok]
        if log.baseline_acc is not None and (not len(steps) or steps[0] > 0):
            steps, acc = np.concatenate([[0.0], steps]), np.concatenate([[log.baseline_acc], acc])
        peak = np.maximum.accumulate(acc)
        # The noise of a difference of two evaluations: binomial with n known, else the unknown-n floor.
        se = (np.sqrt(2 * np.maximum(peak * (1 - peak), 1e-4) / log.eval_n) if log.eval_n else
              np.full(len(acc), th.acc_unknown_n_floor / DAMAGE_SE))
        hit = np.flatnonzero((peak > 0) & (acc < (1 - DAMAGE) * peak) & (peak - acc >= DAMAGE_SE * se))
        gaps = np.diff(steps)
        if not len(hit):
            return None, (f"held-out accuracy never {100 * DAMAGE:.0f} % and {DAMAGE_SE:g} standard errors below its "
                          "running peak"), int(np.median(gaps)) if len(gaps) else 1, False
        k = hit[0]
        resolution = int(steps[k] - steps[k - 1]) if k > 0 else 1
        return int(steps[k]), (f"held-out accuracy {100 * acc[k]:.1f} % at step {int(steps[k])}, {100 * DAMAGE:.0f} % and "
                               f"{(peak[k] - acc[k]) / se[k]:.1f} standard errors below its running peak {100 * peak[k]:.1f} %"
                               f" (n = {log.eval_n or 'unknown'})"), max(resolution, 1), False
    if log.has("reward"):
        w2 = 2 * th.window
        ma = moving_average(s["reward"], w2)
        ma[: w2 - 1] = np.nan
        r = s["reward"][np.isfinite(s["reward"])]
        se = math.sqrt(2) * diff_noise(r) / math.sqrt(w2) if len(r) >= 3 else math.inf
        peak = np.fmax.accumulate(np.where(np.isfinite(ma), ma, -np.inf))
        hit = np.flatnonzero(np.isfinite(ma) & (peak > 0) & (ma < (1 - DAMAGE) * peak) & (peak - ma >= DAMAGE_SE * se))
        if not len(hit):
            return None, (f"proxy (no evaluation): the reward's moving mean never {100 * DAMAGE:.0f} % and {DAMAGE_SE:g} "
                          "standard errors below its running peak"), 1, True
        k = hit[0]
        return int(s["step"][k]), (f"proxy (no evaluation): the reward's {w2}-step moving mean {ma[k]:.3f} at step "
                                   f"{int(s['step'][k])}, {100 * DAMAGE:.0f} % and {(peak[k] - ma[k]) / se:.1f} standard "
                                   f"errors below its running peak {peak[k]:.3f}"), 1, True
    return None, "no held-out accuracy and no reward", 1, False


def lead_time(diag: Diagnosis, log: RunLog, th: Thresholds = Thresholds()) -> Lead:
    def first(severity: str) -> tuple[int | None, str]:
        cs = [c for c in diag.conditions if c.severity == severity]
        if not cs:
            return None, ""
        c = min(cs, key=lambda c: (c.first_step, c.id))
        return c.first_step, c.id
    (fw, w), (fc, cr) = first("warning"), first("critical")
    step, words, resolution, proxy = damage_step(log, th)
    return Lead(fw, w, fc, cr, step, words, resolution, proxy)
