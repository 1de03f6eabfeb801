"""The run record: `steps.csv` (one row per step) and `reward-vs-step.csv` (one row per
sampling point, first columns `step,reward,kl,loss,sample_acc`).

Rows are appended and flushed as they happen. Opening for a resume from step s drops every row
past s (and a torn last line), so after any crash and resume each step is there exactly once.
A sink like the others, the first of a run's RunSession (session.py), so that any trainer, ours or
TRL's, writes the same record.
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from pathlib import Path

from grpo_sentinel.telemetry.schema import RunInfo, StepStats

CURVE_HEAD = ["step", "reward", "kl", "loss", "sample_acc"]  # the user's required format, in this order
TEXT = ("skipped", "health", "trace_ids", "eval_trace_id")  # the text columns, in this order, last in steps.csv
_NOT_AVERAGED = {"step", "eval_n", "sample_acc", "greedy_acc", *TEXT}


def _fmt(v) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.6g}"
    return str(v)


class _CsvLog:
    def __init__(self, path: Path, columns: list[str]):
        self.path, self.columns = path, columns
        self._f = None

    def open(self, keep_through: int | None) -> list[dict[str, str]]:
        """Open for appending. keep_through=None starts fresh; else rows with step > it are dropped."""
        kept: list[dict[str, str]] = []
        if keep_through is not None and self.path.exists():
            with self.path.open(newline="") as f:
                text = f.read()
            if not text.endswith("\n"):  # torn last line from a kill mid-write
                text = text[: text.rfind("\n") + 1]
            kept = [r for r in csv.DictReader(text.splitlines()) if int(r["step"]) <= keep_through]
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, self.columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(kept)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        self._f = self.path.open("a", newline="")
        self._writer = csv.DictWriter(self._f, self.columns, extrasaction="ignore")
        return kept

    def append(self, row: dict) -> None:
        self._writer.writerow({k: _fmt(v) for k, v in row.items()})
        self._f.flush()

    def close(self) -> None:
        if self._f:
            self._f.close()
            self._f = None


class RunRecord:
    """Consumes StepStats; writes both CSVs. A curve row averages the steps since the previous one."""

    def __init__(self, run_dir: Path, reward_names: list[str], trace_url: Callable[[str], str] | None = None):
        scalar = [c for c in StepStats.scalar_fields() if c not in ("step", "reward", "kl", "loss", "skipped")]
        rest = scalar + [f"reward_{n}" for n in reward_names]
        self.steps = _CsvLog(run_dir / "steps.csv", CURVE_HEAD + ["greedy_acc", "eval_n"] + rest + list(TEXT))
        # A curve row counts the steps of its window instead (steps_in_window).
        self.curve = _CsvLog(run_dir / "reward-vs-step.csv", CURVE_HEAD + ["greedy_acc", "eval_n"] +
                             [c for c in rest if c != "steps_in_row"] +
                             ["steps_in_window", "skipped_in_window", "eval_trace_id", "eval_trace_url"])
        self.trace_url = trace_url  # trace id -> its Langfuse page (when traces are on and the project is known)
        self._window: list[dict] = []
        self._last: dict | None = None  # the newest row, which closes the window

    def start(self, info: RunInfo) -> None:
        """Nothing to prepare: the files open in `open()`, which knows whether this is a resume."""

    def open(self, resume_step: int | None) -> None:
        rows = self.steps.open(resume_step)
        curve = self.curve.open(resume_step)
        last_point = int(curve[-1]["step"]) if curve else -1
        # Steps after the last curve row belong to the next row's window.
        self._window = [_parse(r) for r in rows if int(r["step"]) > last_point]

    def write_baseline(self, base: StepStats) -> None:
        """Row 0: the held-out accuracy before training (nothing else is measured yet)."""
        ev = base.eval
        self.curve.append({"step": 0, "sample_acc": ev.sample_acc, "greedy_acc": ev.greedy_acc, "eval_n": ev.n,
                           "steps_in_window": 0, "skipped_in_window": 0, **self._trace(base.row())})

    def _trace(self, row: dict) -> dict:
        """The round's first held-out trace, by id and (when known) link."""
        tid = row["eval_trace_id"]
        return {"eval_trace_id": tid, "eval_trace_url": self.trace_url(tid) if tid and self.trace_url else ""}

    def on_step(self, stats: StepStats) -> None:
        row = stats.row()
        self.steps.append(row)
        # Average what the CSV holds, not the in-memory floats: a resumed run re-reads its open window
        # from steps.csv, and both must give the same curve row to the last digit.
        self._window.append(_parse({k: _fmt(v) for k, v in row.items()}))
        self._last = row
        if stats.eval is not None:
            self.point()

    def point(self) -> None:
        """End the open window with a curve row now: at every evaluation, and where a trainer that does
        not evaluate (TRL without an eval set) says so."""
        if self._window:
            self.curve.append(self._window_row(self._last))
            self._window = []

    def _window_row(self, last: dict) -> dict:
        out = {k: last[k] for k in ("step", "sample_acc", "greedy_acc", "eval_n")}
        for k in self.curve.columns:
            if k in out or k in _NOT_AVERAGED or k not in last:
                continue
            values = [r[k] for r in self._window if isinstance(r[k], (int, float)) and not math.isnan(r[k])]
            out[k] = sum(values) / len(values) if values else math.nan
        # Rows read back from an older steps.csv have no steps_in_row: one step each.
        out["steps_in_window"] = int(sum(1 if math.isnan(r.get("steps_in_row", math.nan)) else r["steps_in_row"]
                                         for r in self._window))
        out["skipped_in_window"] = sum(bool(r["skipped"]) for r in self._window)
        return {**out, **self._trace(last)}

    def close(self) -> None:
        self.steps.close()
        self.curve.close()


def _parse(row: dict[str, str]) -> dict:
    """A CSV row read back for the open window: numbers as floats, like a fresh StepStats.row()."""
    out: dict = {}
    for k, v in row.items():
        try:
            out[k] = float(v) if v != "" else math.nan
        except ValueError:
            out[k] = v
    out.update({k: row.get(k, "") for k in TEXT})
    return out


def recorded_steps(path: Path) -> list[int]:
    """The step numbers steps.csv holds, in order (a torn last line, from a kill mid-write, excluded)."""
    text = path.read_text(errors="replace")
    lines = text.splitlines()[: text.count("\n")]  # complete lines only
    out = []
    for r in csv.DictReader(lines):
        try:
            out.append(int(r["step"]))
        except (KeyError, TypeError, ValueError):
            break
    return out


def last_row(path: Path, tail: int = 1 << 16) -> dict[str, str]:
    """The newest complete row of a CSV, read from its end (a long run's steps.csv is large)."""
    with path.open("rb") as f:
        header = f.readline().decode()
        size = f.seek(0, os.SEEK_END)
        f.seek(max(len(header), size - tail))
        lines = f.read().decode(errors="replace").split("\n")[:-1]  # the last piece is empty or torn
    if not lines or (size > tail and len(lines) < 2):
        return {}
    return next(csv.DictReader([header, lines[-1]]), {})
