"""Read run logs into one shape: per-step series under our steps.csv names, plus what the log
could tell about the run (G, max_new_tokens, ln V, eval size), plus notes on what was odd.

Formats: `sentinel` (our steps.csv or reward-vs-step.csv, or a run directory), `book` (the
reasoning-from-scratch CSV: eval accuracy in percent), `trl` (trainer_state.json log_history).
Logs in the wild are messy: a resumed run repeats steps (later rows win), a restarted run starts
its step numbers over in the same file (split: only the last run is diagnosed, and the note says
so), accuracy may be a percentage. Nothing here crashes on those; it reports them.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml


class IngestError(ValueError):
    """The input cannot be read as a run log; the message says why and what was expected."""


@dataclass
class RunLog:
    series: dict[str, np.ndarray]  # name -> [N] float, NaN where missing; always has "step"
    source: str
    format: str
    group_size: int | None = None
    completions_per_step: int | None = None
    window: int | None = None  # detector window the run's config set (health.window), if any
    max_new_tokens: int | None = None
    max_reward: float = 1.0
    ln_vocab: float | None = None
    eval_n: int | None = None
    baseline_acc: float | None = None  # held-out accuracy before training (step 0), if known
    notes: list[str] = field(default_factory=list)

    def has(self, name: str) -> bool:
        return name in self.series and bool(np.isfinite(self.series[name]).any())

    def __len__(self) -> int:
        return len(self.series["step"])


BOOK = {"reward_avg": "reward", "avg_response_len": "response_len", "tokens_per_sec": "tokens_per_s",
        "adv_avg": "adv_mean", "adv_std": "adv_std", "entropy_avg": "entropy", "eval_acc": "sample_acc", "loss": "loss"}
TRL = {"reward": "reward", "kl": "kl", "loss": "loss", "entropy": "entropy", "frac_reward_zero_std": "frac_zero_std",
       "completions/mean_length": "response_len", "completions/clipped_ratio": "truncation_rate",
       "grad_norm": "grad_norm", "learning_rate": "lr"}


def load(path: str | Path, fmt: str = "auto") -> RunLog:
    path = Path(path)
    if path.is_dir():
        path = path / "steps.csv"
    if not path.is_file():
        raise IngestError(f"{path}: no such file (give a steps.csv, reward-vs-step.csv, book CSV, trainer_state.json or run directory)")
    if fmt == "auto":
        fmt = _sniff(path)
    reader = {"sentinel": _sentinel, "book": _book, "trl": _trl}.get(fmt)
    if reader is None:
        raise IngestError(f"unknown format {fmt!r}: use auto, sentinel, book or trl")
    log = reader(path)
    if len(log) == 0:
        raise IngestError(f"{path}: no step rows")
    _fix_steps(log)
    _fix_units(log)
    return log


def _sniff(path: Path) -> str:
    if path.suffix == ".json":
        return "trl"
    try:
        header = next(csv.reader(path.open()))
    except (StopIteration, UnicodeDecodeError, csv.Error) as e:
        raise IngestError(f"{path}: not a CSV with a header row ({e})") from None
    if {"step", "reward", "kl", "loss"} <= set(header):
        return "sentinel"
    if {"step", "reward_avg"} <= set(header):
        return "book"
    raise IngestError(f"{path}: unrecognised columns {header[:8]}; expected our steps.csv, the book format "
                      "(step, reward_avg, ...) or a TRL trainer_state.json")


def _columns(path: Path, rename: dict[str, str] | None) -> dict[str, np.ndarray]:
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "step" not in rows[0]:
        raise IngestError(f"{path}: no 'step' column")
    out = {}
    bad = np.zeros(len(rows))  # rows whose loss/reward cell says nan/inf (an empty cell is only missing)
    for col in ("loss", "reward", "reward_avg"):
        for i, r in enumerate(rows):
            v = (r.get(col) or "").strip().lower()
            if v and v.lstrip("+-") in ("nan", "inf", "infinity"):
                bad[i] = 1
    for i, r in enumerate(rows):
        if r.get("skipped") == "nonfinite":  # our own record: the trainer caught it and skipped the update
            bad[i] = 1
    out["_nonfinite"] = bad
    for col in rows[0]:
        name = col if rename is None else rename.get(col, col if col == "step" else None)
        if name is None:
            continue
        values = []
        for i, r in enumerate(rows, start=2):
            v = (r.get(col) or "").strip()
            try:
                values.append(float(v) if v else math.nan)
            except ValueError:
                if col == "step":
                    raise IngestError(f"{path}:{i}: step {v!r} is not a number") from None
                values.append(math.nan)  # a text column (e.g. 'skipped'): not a series
        out[name] = np.array(values)
    return out


def _sentinel(path: Path) -> RunLog:
    series = _columns(path, None)
    log = RunLog(series, str(path), "sentinel")
    curve = path.parent / "reward-vs-step.csv"
    if path.name == "steps.csv" and curve.is_file():  # the step-0 baseline accuracy lives only there
        base = _columns(curve, None)
        if len(base["step"]) and base["step"][0] == 0 and math.isfinite(base["sample_acc"][0]):
            log.baseline_acc = float(base["sample_acc"][0])
    cfg_path = path.parent / "config.yaml"
    if cfg_path.is_file():
        cfg = yaml.safe_load(cfg_path.read_text()) or {}
        g = cfg.get("grpo", {})
        log.group_size, log.max_new_tokens = g.get("group_size"), g.get("max_new_tokens")
        if log.group_size and g.get("prompts_per_step"):
            log.completions_per_step = log.group_size * g["prompts_per_step"]
        log.window = (cfg.get("health") or {}).get("window")  # the trainer's own window, when it was set
        log.max_reward = max(1.0, sum(max(r.get("weight", 1.0), 0.0) for r in cfg.get("rewards", [])))
    if log.has("entropy_norm") and log.has("entropy"):
        ratio = series["entropy"] / series["entropy_norm"]
        log.ln_vocab = float(np.nanmedian(ratio[np.isfinite(ratio)]))
    if log.has("eval_n"):
        log.eval_n = int(np.nanmax(series["eval_n"]))
    return log


def _book(path: Path) -> RunLog:
    series = _columns(path, BOOK)
    log = RunLog(series, str(path), "book")
    # One prompt per step: the step's group has no signal when its advantages have zero spread, or,
    # without an adv_std column, when the 0/1 correctness reward is all 0 or all 1.
    if log.has("adv_std"):
        zero = series["adv_std"] == 0
        log.notes.append("frac_zero_std derived from adv_std == 0 (one group per step)")
    else:
        zero = (series["reward"] == 0) | (series["reward"] == 1)
        log.notes.append("frac_zero_std derived from reward_avg in {0, 1} (one group per step, 0/1 reward)")
    series["frac_zero_std"] = zero.astype(float)
    series["frac_zero_std_correct"] = (zero & (series["reward"] == 1)).astype(float)
    series["frac_zero_std_wrong"] = (zero & (series["reward"] == 0)).astype(float)
    return log


def _trl(path: Path) -> RunLog:
    try:
        history = json.loads(path.read_text())["log_history"]
    except (ValueError, KeyError, TypeError) as e:
        raise IngestError(f"{path}: not a trainer_state.json with a log_history ({e})") from None
    rows = [h for h in history if "step" in h and any(k in h for k in TRL)]
    evals = {h["step"]: h for h in history if any(k.startswith("eval_") and "acc" in k for k in h)}
    steps = sorted({r["step"] for r in rows} | set(evals))
    by_step = {r["step"]: r for r in rows}
    series = {"step": np.array(steps, dtype=float)}
    for src, name in TRL.items():
        series[name] = np.array([float(by_step.get(s, {}).get(src, math.nan)) for s in steps])
    acc_key = next((k for h in evals.values() for k in h if k.startswith("eval_") and "acc" in k), None)
    series["sample_acc"] = np.array([float(evals.get(s, {}).get(acc_key, math.nan)) for s in steps])
    return RunLog(series, str(path), "trl")


def _fix_steps(log: RunLog) -> None:
    """Resumes (a step number repeats later: later rows win) and restarts (numbering starts over
    at or below the first step: a new run in the same file, split off)."""
    step = log.series["step"]
    keep = np.ones(len(step), dtype=bool)
    start, runs = 0, 1
    for i in range(1, len(step)):
        if step[i] > step[i - 1]:
            continue
        if step[i] <= step[start]:  # numbering starts over: a new run
            keep[:i] = False
            start, runs = i, runs + 1
        else:  # a resume from an earlier checkpoint: the rows it re-does replace the old ones
            redo = (np.arange(len(step)) < i) & (step >= step[i])
            log.notes.append(f"row {i + 2}: resumed at step {int(step[i])}; {int((redo & keep).sum())} earlier rows superseded")
            keep &= ~redo
    if runs > 1:
        log.notes.append(f"the log holds {runs} runs (step numbering starts over); diagnosing the last, from row {start + 2}")
    if not keep.all():
        log.series = {k: v[keep] for k, v in log.series.items()}


def _fix_units(log: RunLog) -> None:
    acc = log.series.get("sample_acc")
    if acc is not None and np.nanmax(acc, initial=0) > 1.0:
        log.series["sample_acc"] = acc / 100
        log.notes.append("sample_acc looked like a percentage (max > 1): divided by 100")
