"""Read run logs into one shape: per-step series under our steps.csv names, plus what the log
could tell about the run (G, max_new_tokens, ln V, eval size), plus notes on what was odd.

Formats: `sentinel` (our steps.csv or reward-vs-step.csv, or a run directory), `book` (the
reasoning-from-scratch CSV: eval accuracy in percent), `csv` (any other CSV with a step column),
`trl` (trainer_state.json log_history, or that list saved on its own; a JSON object of one list per
metric is read too), `verl` and `openrlhf` (JSONL
metric logs, one object a line, flat or verl's {"step": s, "data": {...}}), `jsonl` (any other such
log), `stdout` (a console log), `notebook` (a Jupyter notebook's saved progress table).

Logs in the wild name things differently, and an ingester that ignores a column throws away the
evidence: every column is mapped to one of our names (ALIASES), read as a reward component, or
ignored with the reason, and the notes list which. A signed KL estimator (k1 can be negative) is
kept as it is and said so. Auxiliary reward components (format, length, style) are summed into
`reward_aux`; correctness is read from the correctness component, never from a combined reward
that can exceed 1. A completion cap the log does not state is inferred when lengths pile up at
one ceiling. Logs are messy: a resumed run repeats steps (later rows win), a restarted run starts
its step numbers over in the same file (split: only the last run is diagnosed, and the note says
so), accuracy may be a percentage. Nothing here crashes on those; it reports them.
"""

from __future__ import annotations

import ast
import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo_sentinel.telemetry.health.runlog import CORRECTNESS, RunLog, component_kind
from grpo_sentinel.telemetry.health.thresholds import coerce
from grpo_sentinel.telemetry.health.vocabulary import (
    ALIASES,
    BY_ALIAS,
    EVAL_ACCURACY,
    FORM,
    IGNORED,
    STEP_KEYS,
    component,
    is_eval_key,
    meaning,
)
from grpo_sentinel.telemetry.runfiles import RUN_INFO, read_run_info


class IngestError(ValueError):
    """The input cannot be read as a run log; the message says why and what was expected."""


@dataclass(frozen=True)
class Reading:
    """What the user says about a log that its names do not: its step column (`--step-column`), and which of
    its columns are which of ours (`--map OURS=THEIRS`, or a YAML file of them)."""

    step: str | None = None
    names: dict[str, str] = field(default_factory=dict)  # our name -> the log's column


def load(path: str | Path, fmt: str = "auto", how: Reading = Reading()) -> RunLog:
    path = Path(path)
    if path.is_dir():
        path = _log_in(path)
    if not path.is_file():
        raise IngestError(f"{path}: no such file (give a steps.csv, reward-vs-step.csv, book CSV, trainer_state.json, "
                          "a JSONL or CSV metrics log, a W&B history export, a run directory or a TRL output_dir)")
    if fmt == "auto":
        fmt = _sniff(path)
    reader = {"sentinel": _sentinel, "book": _book, "csv": _csv, "trl": _trl,
              "jsonl": _jsonl, "verl": _jsonl, "openrlhf": _jsonl, "stdout": _stdout, "notebook": _notebook}.get(fmt)
    if reader is None:
        raise IngestError(f"unknown format {fmt!r}: use auto, sentinel, book, csv, trl, verl, openrlhf, jsonl, stdout "
                          "or notebook")
    try:
        log = reader(path, how)
    except OSError as e:
        raise IngestError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise IngestError(f"{path}: not a text file (expected a CSV, a trainer_state.json or a JSONL log)") from None
    if len(log) == 0:
        raise IngestError(f"{path}: the header is there but no step rows follow: nothing to diagnose yet")
    _fix_steps(log)
    _fix_units(log)
    _derive(log)
    if not any(log.has(k) for k in log.series if k not in ("step", "_nonfinite")) and not log.series["_nonfinite"].any():
        raise IngestError(_nothing_read(path, log))
    return log


def _nothing_read(path: Path, log: RunLog) -> str:
    """Why nothing was read, truthfully: columns with numbers that no name of ours matched, or none at all."""
    if not log.unread:
        return f"{path}: every value is empty or not a number: nothing to diagnose"
    shown = ", ".join(log.unread[:12]) + (f" and {len(log.unread) - 12} more" if len(log.unread) > 12 else "")
    return (f"{path}: it holds numbers, but no column's name says what it is to this reader ({shown}); say which is "
            f"which with --map, e.g. --map reward={log.unread[0]} (ours: {', '.join(READABLE)})")


READABLE = ("reward", "train_acc", "sample_acc", "kl", "loss", "entropy", "frac_zero_std", "response_len",
            "truncation_rate", "grad_norm", "mismatch_kl")  # the names a --map most often needs (ALIASES has them all)


def _log_in(directory: Path) -> Path:
    """The log a directory holds: our run directory's steps.csv, else a TRL output_dir's
    trainer_state.json (trainer.save_state() writes it), else its newest checkpoint's."""
    for candidate in (directory / "steps.csv", directory / "trainer_state.json"):
        if candidate.is_file():
            return candidate
    checkpoints = sorted(directory.glob("checkpoint-*/trainer_state.json"),
                         key=lambda p: int(re.sub(r"\D", "", p.parent.name) or 0))
    return checkpoints[-1] if checkpoints else directory / "steps.csv"


# ---------------------------------------------------------------------------------------------
# Formats


def _sniff(path: Path) -> str:
    try:
        with path.open(encoding="utf-8") as f:
            head = f.read(4096)
    except UnicodeDecodeError:
        raise IngestError(f"{path}: not a text file (expected a CSV, a trainer_state.json or a JSONL log)") from None
    stripped = head.lstrip()
    if path.suffix == ".ipynb":
        return "notebook"
    if path.suffix == ".json" or (stripped.startswith("{") and '"log_history"' in head):
        return "trl"
    if any(_STDOUT_LINE.search(line) for line in head.splitlines()[:50]):
        return "stdout"
    if path.suffix == ".jsonl" or stripped.startswith("{"):
        return "jsonl"
    try:
        header = next(csv.reader([head.splitlines()[0]])) if head.strip() else []
    except csv.Error as e:
        raise IngestError(f"{path}: not a CSV with a header row ({e})") from None
    names = {h.strip().lower() for h in header}
    if not names:
        raise IngestError(f"{path}: empty file (expected a CSV with a header row, a trainer_state.json or a JSONL log)")
    if {"step", "reward", "kl", "loss"} <= names:
        return "sentinel"
    if {"step", "reward_avg"} <= names:
        return "book"
    if names & set(STEP_KEYS) or not _printed_steps_further_in(path):
        return "csv"  # without a step column: rows in order (_table says so)
    return "stdout"


def _printed_steps_further_in(path: Path, lines: int = 5000) -> bool:
    """A console log whose first step line comes after a long preamble: a verl run prints its launch
    script and its config (hundreds of lines) before step 1."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return any(_STDOUT_LINE.search(line) for line, _ in zip(f, range(lines)))


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        try:
            rows = list(reader)
            header = list(reader.fieldnames or [])
        except csv.Error as e:
            raise IngestError(f"{path}: not a well-formed CSV ({e})") from None
    return header, rows


def _number(v) -> float:
    """A cell as a float: numbers and numeric strings; anything else (text, None, lists, bools) is NaN."""
    if isinstance(v, bool):
        return math.nan
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v.strip()) if v.strip() else math.nan
        except ValueError:
            return math.nan
    return math.nan


def _nonfinite_text(v) -> bool:
    """A cell that says nan/inf (an empty cell is only missing)."""
    if isinstance(v, float):
        return not math.isfinite(v)
    return isinstance(v, str) and v.strip().lower().lstrip("+-") in ("nan", "inf", "infinity")


def _table(path: Path, records: list[dict], fmt: str, where: str = "row", how: Reading = Reading()) -> RunLog:
    """Records (one per logged step, or several kinds per step: _merge_kinds) keyed by the log's own names ->
    a RunLog with ours. Every key is accounted for in the notes: mapped, read as a reward component, or ignored."""
    step_key = _step_key(path, _keys(records), how)
    notes = []
    if step_key is not None:
        records, merged = _merge_kinds(records, step_key)
        notes += merged
    keys = _keys(records)
    chosen = _choose(path, keys, how)  # our name -> source key
    steps, bad_steps, kept = [], 0, []
    for i, r in enumerate(records, start=1):
        s = _number(r.get(step_key)) if step_key is not None else float(i)
        if not math.isfinite(s):
            bad_steps += 1
            continue
        steps.append(s)
        kept.append(r)
    if step_key is None:
        notes.append(f"no step column (looked for {', '.join(STEP_KEYS)}): rows are numbered in order, one a step "
                     "(--step-column NAME names it)")
    if bad_steps:
        what = "rows" if where == "row" else "entries"
        if not steps:
            raise IngestError(f"{path}: no {where} has a numeric step ({step_key!r}); {bad_steps} {what} without one "
                              "(--step-column NAME names another)")
        notes.append(f"{bad_steps} {what} without a numeric {step_key!r} skipped")
    series: dict[str, np.ndarray] = {"step": np.array(steps, dtype=float)}
    used = {step_key} if step_key is not None else set()
    for name, k in chosen.items():
        series[name] = np.array([_number(r.get(k)) for r in kept])
        used.add(k)
    bad = np.zeros(len(kept))  # steps whose loss/reward says nan/inf
    for name in ("loss", "reward"):
        if name in chosen:
            bad = np.maximum(bad, [float(_nonfinite_text(r.get(chosen[name]))) for r in kept])
    bad = np.maximum(bad, [float(r.get("skipped") == "nonfinite") for r in kept])  # our record: the trainer skipped it
    series["_nonfinite"] = bad
    log = RunLog(series, str(path), fmt, notes=notes)
    components: dict[str, str] = {}
    ignored: list[str] = []
    for k in keys:
        if k in used:
            continue
        low = k.strip().lower()
        # ROLL (step column system/step) logs reward/* as rates and statistics of the one reward, not components.
        fn = None if step_key == "system/step" and low.startswith("reward/") else component(low)
        if fn is not None and fn not in components and not is_eval_key(low):
            components[fn] = k
            continue
        numeric = any(math.isfinite(_number(r.get(k))) for r in kept)
        if low in BY_ALIAS or meaning(low) in chosen:
            ours = BY_ALIAS.get(low) or meaning(low)
            ignored.append(f"{k} (duplicate of {chosen[ours]} -> {ours})" if ours in chosen else f"{k} (no row reads it)")
        elif low in IGNORED:
            ignored.append(f"{k} ({IGNORED[low]})")
        elif step_key == "system/step" and low.startswith("reward/"):
            ignored.append(f"{k} (ROLL: a rate or statistic of the reward, not a component to sum)")
        elif low in ("skipped", "health", "_kind"):
            continue  # our own record's text columns (read as markers above), and the record kinds merged
        elif not numeric:
            ignored.append(f"{k} (no numeric value)")
        else:
            ignored.append(f"{k} (no row reads it)")
            if low not in STEP_KEYS:
                log.unread.append(k)
    for fn, k in components.items():
        series[f"reward_{fn}"] = np.array([_number(r.get(k)) for r in kept])
    log.read = [n if n == k else f"{k} -> {n}" for n, k in chosen.items()] + [
        f"{k} -> reward_{fn}" for fn, k in components.items()
    ]
    if step_key is not None:
        log.read.insert(0, "step" if step_key == "step" else f"{step_key} -> step")
    if chosen.get("is_ratio_mean", "").startswith("sampling/"):  # TRL logs the ratio its correction put in the loss
        log.sampler["ratio"] = "after TRL's truncation or masking (its sampling/importance_sampling_ratio)"
    given = {k for n, k in how.names.items()}
    log.notes.append("columns read: " + ", ".join(log.read[:len(chosen) + (step_key is not None)])
                     + (f" ({', '.join(sorted(given))} as --map said)" if given else ""))
    if components:
        log.notes.append("reward components: " + ", ".join(f"{k} ({component_kind(fn)})" for fn, k in components.items()))
    if ignored:
        log.notes.append("columns ignored: " + ", ".join(ignored))
    return log


def _keys(records: list[dict]) -> list[str]:
    """Every key of the records, in the order they first appear."""
    return list(dict.fromkeys(k for r in records for k in r))


def _step_key(path: Path, keys: list[str], how: Reading) -> str | None:
    """The log's step column: the one the user named, else the first step-like key it has, else None (rows in order)."""
    if how.step is not None:
        if how.step not in keys:
            raise IngestError(f"{path}: --step-column {how.step!r} is not a column of the log; its columns: "
                              f"{', '.join(keys[:20])}" + (" ..." if len(keys) > 20 else ""))
        return how.step
    lower = {k.strip().lower(): k for k in reversed(keys)}
    return next((lower[a] for a in STEP_KEYS if a in lower), None)


def _choose(path: Path, keys: list[str], how: Reading) -> dict[str, str]:
    """Our name -> the log's column: what --map says, then the exact aliases in order of preference, then the
    columns whose names mean one of ours (vocabulary.meaning), then the held-out accuracy under another name."""
    unknown = [n for n in how.names if n not in ALIASES or n == "step"]
    if unknown:
        ours = ", ".join(n for n in ALIASES if n != "step")
        raise IngestError(f"--map {unknown[0]}=...: {unknown[0]!r} is not a name of ours; ours: {ours}")
    missing = [k for k in how.names.values() if k not in keys]
    if missing:
        raise IngestError(f"{path}: --map ...={missing[0]}: the log has no column {missing[0]!r}; its columns: "
                          f"{', '.join(keys[:20])}" + (" ..." if len(keys) > 20 else ""))
    chosen = dict(how.names)
    taken = set(chosen.values())
    lower = {k: k.strip().lower() for k in keys}
    for name, aliases in ALIASES.items():
        if name == "step" or name in chosen:
            continue
        k = next((k for a in aliases for k in keys if lower[k] == a and k not in taken), None)
        if k is not None:
            chosen[name] = k
            taken.add(k)
    for k in keys:
        name = meaning(lower[k]) if k not in taken and lower[k] not in STEP_KEYS else None
        if name is not None and name not in chosen and name != "step":
            chosen[name] = k
            taken.add(k)
    if "sample_acc" not in chosen:
        k = next((k for k in keys if EVAL_ACCURACY.match(lower[k]) and "std" not in lower[k]
                  and not FORM.search(lower[k]) and k not in taken), None)
        if k is not None:
            chosen["sample_acc"] = k
    return chosen


# Several record kinds in one log (rollout, train, eval records at the same step): the kind from a key that
# names it, else from the columns (every metric under an evaluation prefix: an evaluation).
KIND_KEYS = ("kind", "type", "record_type", "record", "split", "phase", "mode", "stage", "event")
_EVAL_KIND = re.compile(r"^(eval|evaluation|val|valid|validation|test|heldout|held_out)", re.I)


def _kind(r: dict, step_key: str) -> str | None:
    for k in KIND_KEYS:
        v = r.get(k)
        if isinstance(v, str) and v.strip() and len(v) < 40:
            return "eval" if _EVAL_KIND.match(v.strip()) else v.strip().lower()
    metrics = [k for k in r if k != step_key and k.strip().lower() not in STEP_KEYS]
    return "eval" if metrics and all(is_eval_key(k) for k in metrics) else None


def _merge_kinds(records: list[dict], step_key: str) -> tuple[list[dict], list[str]]:
    """Consecutive records of one step that are parts of it (another kind, or other columns) become one row; a
    record that repeats a step's columns starts a new row (a resume or a restart: _fix_steps). An evaluation
    record's columns get an `eval/` prefix: held-out measurements of its step, never a training row."""
    rows: list[dict] = []
    kinds: list[set] = []
    counts: dict[str, int] = {}
    for r in records:
        kind = _kind(r, step_key)
        counts[kind or "untyped"] = counts.get(kind or "untyped", 0) + 1
        body = {k: v for k, v in r.items() if not (kind is not None and k in KIND_KEYS and r.get(k) is not None
                                                    and isinstance(r.get(k), str))}
        if kind == "eval":
            body = {k if k == step_key or k.strip().lower() in STEP_KEYS or is_eval_key(k) else f"eval/{k}": v
                    for k, v in body.items()}
        row = rows[-1] if rows else None
        same_step = row is not None and _number(row.get(step_key)) == _number(r.get(step_key))
        metrics = {k for k in body if k != step_key}
        if same_step and (kind not in kinds[-1] or not metrics & set(row)):
            clash = {k for k in metrics if k in row and row[k] != body[k]}
            row.update({(f"{kind}/{k}" if k in clash else k): v for k, v in body.items()})
            kinds[-1].add(kind)
        else:
            rows.append(dict(body))
            kinds.append({kind})
    if len(rows) == len(records):
        return records, []
    return rows, [f"{len(records)} records of {len(counts)} kind(s) ({', '.join(f'{k}: {n}' for k, n in counts.items())}) "
                  f"merged by step into {len(rows)} rows: the parts of one step are one row, and an evaluation at a step "
                  "is an evaluation of that step (its columns read as eval/...), never a resume"]


def _csv(path: Path, how: Reading = Reading(), fmt: str = "csv") -> RunLog:
    header, rows = _read_csv(path)
    if not header:
        raise IngestError(f"{path}: empty file (expected a header row)")
    if not rows:
        raise IngestError(f"{path}: the header is there but no step rows follow: nothing to diagnose yet")
    # A non-numeric step is an error in a CSV (the file is not what it claims); rows are line-numbered. A W&B
    # history export's step (_step) is numbered on every row too.
    step_col = _step_key(path, header, how)
    for i, r in enumerate(rows, start=2):
        if step_col is not None and not math.isfinite(_number(r.get(step_col))):
            raise IngestError(f"{path}:{i}: step {r.get(step_col)!r} is not a number (--step-column NAME names another)")
    log = _table(path, rows, fmt, how=how)
    if "trace_ids" in header and step_col:  # our record: each step's traced groups, the explaining ones first
        log.traces = {int(_number(r[step_col])): r["trace_ids"].split()[0] for r in rows if (r.get("trace_ids") or "").strip()}
    return log


def _sentinel(path: Path, how: Reading = Reading()) -> RunLog:
    log = _csv(path, how, "sentinel")
    curve = path.parent / "reward-vs-step.csv"
    if path.name == "steps.csv" and curve.is_file():  # the step-0 baseline accuracy lives only there
        _, base = _read_csv(curve)
        if base and _number(base[0].get("step")) == 0 and math.isfinite(_number(base[0].get("sample_acc"))):
            log.baseline_acc = _number(base[0]["sample_acc"])
    if (path.parent / RUN_INFO).is_file():
        _read_run_info(log, path.parent / RUN_INFO)
    elif (path.parent / "config.yaml").is_file():  # the legacy path: said, not read (it is the service's file)
        log.notes.append(f"{path.parent}: no run.json (recorded before telemetry wrote one): G, the window and the "
                         "largest reward are not known from the run; give --window (and --max-new-tokens)")
    if log.has("entropy_norm") and log.has("entropy"):
        ratio = log.series["entropy"] / log.series["entropy_norm"]
        ok = np.isfinite(ratio) & (ratio > 0)
        if ok.any():
            log.ln_vocab = float(np.median(ratio[ok]))
    if log.has("eval_n"):
        log.eval_n = int(np.nanmax(log.series["eval_n"]))
    if log.has("steps_in_row") and np.nanmax(log.series["steps_in_row"]) > 1:
        log.notes.append(f"rows cover up to {int(np.nanmax(log.series['steps_in_row']))} optimizer steps each (the "
                         "trainer logged means over them): windows and steps count rows")
    return log


def _read_run_info(log: RunLog, path: Path) -> None:
    """G, prompts per step, max_new_tokens, the window and the thresholds the run changed, the largest
    reward, ln V and the traces' project from the run's run.json (telemetry writes it at each start:
    session.py). A run directory from before run.json (only config.yaml, the service's own file) gives
    none of these: --window and the other flags say them."""
    try:
        info = read_run_info(path)
    except ValueError as e:
        raise IngestError(f"{e}; fix it, or diagnose a copy of steps.csv outside the run directory") from None
    sc = info.scales
    for name, value in sc.thresholds.items():  # each inside its domain, as health.thresholds checked it
        try:
            coerce(name, value)
        except ValueError as e:
            raise IngestError(f"{path}: scales.thresholds: {e}; fix it, or diagnose a copy of steps.csv outside the "
                              "run directory") from None
    log.group_size, log.max_new_tokens, log.window = sc.group_size, sc.max_new_tokens, sc.window
    log.thresholds = dict(sc.thresholds)
    log.max_reward, log.ln_vocab, log.trace_project = sc.max_reward, sc.ln_vocab, info.traces_project
    log.sampler, log.sampling = dict(info.sampler), dict(info.sampling)
    if sc.group_size and sc.prompts_per_step:
        log.completions_per_step = round(sc.group_size * sc.prompts_per_step)


def _book(path: Path, how: Reading = Reading()) -> RunLog:
    log = _csv(path, how, "book")
    series = log.series
    # One prompt per step: the step's group has no signal when its advantages have zero spread, or,
    # without an adv_std column, when the 0/1 correctness reward is all 0 or all 1.
    if log.has("adv_std"):
        zero = series["adv_std"] == 0
        log.notes.append("derived: frac_zero_std from adv_std == 0 (one group per step)")
    else:
        zero = (series["reward"] == 0) | (series["reward"] == 1)
        log.notes.append("derived: frac_zero_std from reward_avg in {0, 1} (one group per step, 0/1 reward)")
    series["frac_zero_std"] = zero.astype(float)
    series["frac_zero_std_correct"] = (zero & (series["reward"] == 1)).astype(float)
    series["frac_zero_std_wrong"] = (zero & (series["reward"] == 0)).astype(float)
    return log


def _trl(path: Path, how: Reading = Reading()) -> RunLog:
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise IngestError(f"{path}: not valid JSON ({e}); expected a TRL trainer_state.json") from None
    # A bare list is log_history saved on its own (json.dump(trainer.state.log_history, f): a common way to keep it).
    history = state if isinstance(state, list) else state.get("log_history") if isinstance(state, dict) else None
    if history is None and isinstance(state, dict) and (log := _columnar(path, state, how)) is not None:
        return log
    if not isinstance(history, list):
        raise IngestError(f"{path}: no 'log_history' list; expected a TRL/transformers trainer_state.json (or its "
                          "log_history list, or an object of one list per metric)")
    entries = [h for h in history if isinstance(h, dict)]
    notes = []
    if len(entries) < len(history):
        notes.append(f"{len(history) - len(entries)} log_history entries are not objects: skipped")
    # Training entries and evaluation entries share steps: merge them per step (eval keys are eval_*).
    evaluated = {_number(h.get("step")) for h in entries if any(str(k).startswith("eval_") for k in h)}
    by_step: dict[float, dict] = {}
    bad = 0
    for h in entries:
        s = _number(h.get("step"))
        if not math.isfinite(s):
            bad += 1
            continue
        by_step.setdefault(s, {}).update(h)
    if bad:
        notes.append(f"{bad} log_history entries without a numeric 'step' skipped")
    if not by_step:
        raise IngestError(f"{path}: log_history has no entry with a numeric 'step'")
    records = [by_step[s] for s in sorted(by_step)]
    for r in records:
        for k in ("train_runtime", "train_loss", "total_flos", "train_samples_per_second", "train_steps_per_second"):
            r.pop(k, None)  # the end-of-training summary entry: not a step
    log = _table(path, records, "trl", "entry", how)
    log.notes[:0] = notes
    if isinstance(state, list):
        log.notes.insert(0, "a log_history list saved on its own (no trainer_state.json around it)")
    if path.parent.name.startswith("checkpoint-"):
        log.notes.insert(0, f"log_history of {path.parent.name}/trainer_state.json (the newest checkpoint's)")
    output_dir = path.parent.parent if path.parent.name.startswith("checkpoint-") else path.parent
    names = [k[len("rewards/"):-len("/mean")] for k in dict.fromkeys(k for r in records for k in r)
             if k.startswith("rewards/") and k.endswith("/mean")]
    _trl_completions(log, output_dir / "completions", names, evaluated)
    return log


def _columnar(path: Path, state: dict, how: Reading = Reading()) -> RunLog | None:
    """{"rewards_avg": [...], "kl_avg": [...]}: a hand-written loop's metrics kept as one list per metric,
    one entry a logged step. The lists of the longest length are the columns; a step column numbers the
    rows, else they are numbered in order. None when the object holds no list."""
    lists = {k: v for k, v in state.items() if isinstance(v, list) and v
             and all(x is None or isinstance(x, (int, float, str)) and not isinstance(x, bool) for x in v)}
    if not lists:  # no list of scalars: not metric columns (a list of dicts is log_history under another name)
        return None
    n = max(len(v) for v in lists.values())
    columns = {k: v for k, v in lists.items() if len(v) == n}
    records = [{k: v[i] for k, v in columns.items()} for i in range(n)]
    numbered = how.step is None and not any(k.strip().lower() in STEP_KEYS for k in columns)
    if numbered:
        for i, r in enumerate(records, start=1):
            r["step"] = i
    log = _table(path, records, "json", how=how)
    others = [k for k in state if k not in columns]
    log.ignored += [f"{k} (not one value a row)" for k in others]
    log.notes.insert(0, f"an object of one list per metric ({n} entries)"
                     + ("; no step column: rows are numbered in order, one a logged step" if numbered else "")
                     + (f"; not read, not one value a row: {', '.join(others)}" if others else ""))
    return log


def _trl_completions(log: RunLog, folder: Path, names: list[str], evaluated: set[float]) -> None:
    """TRL's completions/completions_<step>.parquet (log_completions=True): each logged step's last
    generation batch, one row per completion with its prompt, rewards per function and TRL's own
    advantage. They give what the logged means cannot: the advantages' mean and spread (adv_mean_drift
    on TRL's real advantages) and the all-correct / all-wrong split of the groups without signal."""
    files = sorted(folder.glob("completions_*.parquet"))
    if not files:
        return
    try:
        import pyarrow.parquet as pq
    except ImportError:
        log.notes.append(f"{folder}: {len(files)} completion files not read (they need pyarrow: "
                         "pip install 'grpo-sentinel[trl]')")
        return
    row = {s: i for i, s in enumerate(log.series["step"])}
    correctness = next((n for n in names if CORRECTNESS.search(n)), None)
    out = {k: np.full(len(row), math.nan) for k in ("adv_mean", "adv_std", "frac_zero_std_correct", "frac_zero_std_wrong")}
    read, after_eval, sizes, bad = [], 0, set(), []
    for f in files:
        try:
            table = pq.read_table(f).to_pydict()
        except Exception as e:  # noqa: BLE001 - a torn or foreign file is noted, the log still read
            bad.append(f"{f.name} ({type(e).__name__})")
            continue
        if not table.get("step") or "advantage" not in table or not set(names) <= set(table):
            bad.append(f"{f.name} (not TRL's completions table)")
            continue
        step = float(table["step"][0])
        if step in evaluated:  # TRL writes the file again after an evaluation at that step: it holds the eval's
            after_eval += 1
            continue
        G = _group_of(table["prompt"])
        if step not in row or G < 2:
            bad.append(f"{f.name} (step {step:g} not in the log)" if step not in row else f"{f.name} (no groups)")
            continue
        _completion_stats(out, row[step], table, names, correctness, G)
        read.append(step)
        sizes.add(G)
    for k, v in out.items():
        if np.isfinite(v).any():
            log.series[k] = v
    if read:
        log.notes.append(f"{folder.name}/*.parquet: {len(read)} steps ({min(read):g}-{max(read):g}) read per completion "
                         "(TRL's own advantages; each file is its step's last generation batch)"
                         + (f"; {after_eval} written after an evaluation skipped (they hold its completions)"
                            if after_eval else ""))
    if len(sizes) == 1 and log.group_size is None:
        log.group_size = sizes.pop()
        log.notes.append(f"derived: G = {log.group_size} from {folder.name}/*.parquet (runs of identical prompts)")
    if bad:
        log.notes.append(f"{folder.name}: not read: {', '.join(bad[:5])}" + (f" and {len(bad) - 5} more" if len(bad) > 5 else ""))


def _group_of(prompts: list) -> int:
    """G of a generation batch: TRL samples each prompt G times in a row; the gcd of the runs of
    identical prompts (two equal prompts drawn side by side make a run of 2G)."""
    runs, n = [], 1
    for a, b in zip(prompts, prompts[1:]):
        if str(a) == str(b):
            n += 1
        else:
            runs.append(n)
            n = 1
    runs.append(n)
    return math.gcd(*runs) if prompts and len(prompts) % math.gcd(*runs) == 0 else 0


def _completion_stats(out: dict[str, np.ndarray], i: int, table: dict, names: list[str], correctness: str | None,
                      G: int) -> None:
    adv = np.array(table["advantage"], dtype=float)
    rewards = np.array([[math.nan if v is None else v for v in table[n]] for n in names], dtype=float)  # [K, B]
    scored = ~np.isnan(rewards).all(axis=0)  # TRL excludes a completion every function returned None for
    if scored.any():
        out["adv_mean"][i] = adv[scored].mean()
        out["adv_std"][i] = adv[scored].std(ddof=1) if scored.sum() > 1 else 0.0
    if correctness is not None:
        zero = (np.abs(adv.reshape(-1, G)) < 1e-6).all(axis=1)  # a group without signal: every advantage 0
        right = (rewards[names.index(correctness)] >= 1.0).reshape(-1, G)
        out["frac_zero_std_correct"][i] = (zero & right.all(axis=1)).mean()
        out["frac_zero_std_wrong"][i] = (zero & ~right.any(axis=1)).mean()


def _jsonl(path: Path, how: Reading = Reading()) -> RunLog:
    records, bad = [], 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                bad += 1
                continue
            if not isinstance(obj, dict):
                bad += 1
                continue
            data = obj.get("data")
            if isinstance(data, dict):  # verl's file logger: {"step": s, "data": {metric: value}}
                obj = {**{k: v for k, v in obj.items() if k != "data"}, **data}
            records.append(obj)
    if not records:
        raise IngestError(f"{path}: no JSON object lines (expected one metrics object per line)")
    keys = {k for r in records for k in r}
    fmt = ("verl" if any(k.startswith(("actor/", "critic/", "response_length/")) for k in keys) else
           "openrlhf" if {"policy_loss", "return"} & keys or any(k.startswith("eval_") and "pass" in k for k in keys) else
           "jsonl")
    log = _table(path, records, fmt, "line", how)
    if bad:
        log.notes.insert(0, f"{bad} lines are not JSON objects: skipped")
    return log


# A training's printed output, one step a line: TRL's printed log dicts ("{'loss': 0.0, 'reward': ...}",
# numbers or, since TRL 0.20, numbers as strings), verl's console logger ("step:12 - actor/pg_loss:0.1 -
# critic/score/mean:0.4") and "[Step 3/500] loss=0.1 reward_avg=0.25" (the book's scripts, and many
# hand-written loops). Anything else on a line (progress bars, warnings) is skipped. verl since 0.4 prints
# numpy scalars as their repr ("actor/pg_loss:np.float64(-0.0007)"): the number inside is the value.
_STDOUT_LINE = re.compile(r"\{'[^']+': |\bstep:\s*\d+\s+-\s+\S+:|\[step\s+\d+(/\d+)?\]", re.I)
_VERL_PAIR = re.compile(r"(?:^|\s-\s)([A-Za-z_][\w/@().-]*):\s*(?:np\.\w+\()?([-+\w.]+)")
_EQ_PAIR = re.compile(r"([A-Za-z_][\w/.-]*)=([-+\w.]+)")
_STEP_TAG = re.compile(r"\[step\s+(\d+)(?:/\d+)?\]", re.I)
_TRL_SUMMARY = {"train_runtime", "train_loss", "total_flos", "train_samples_per_second", "train_steps_per_second"}


def _stdout_record(line: str) -> tuple[str, dict] | None:
    """One printed line -> (which printer, its values), or None when the line is not a step's."""
    if (i := line.find("{'")) >= 0 and (j := line.rfind("}")) > i:
        try:
            obj = ast.literal_eval(line[i:j + 1])
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return None
        # The Trainer's log dicts hold numbers (strings of them since TRL 0.20) and at most None; any other
        # printed dict (a chat message, a config) is not a step.
        values = list(obj.values()) if isinstance(obj, dict) else []
        numeric = [v for v in values if v is not None and not isinstance(v, bool) and math.isfinite(_number(v))]
        numbers_only = all(v is None or v in numeric or _nonfinite_text(v) for v in values)
        return ("trl", obj) if numeric and numbers_only else None
    if m := re.search(r"\bstep:\s*(\d+)\s+-\s+", line):
        return "verl", {"step": m.group(1), **dict(_VERL_PAIR.findall(line[m.end() - 3:]))}
    if (m := _STEP_TAG.search(line)) and (pairs := _EQ_PAIR.findall(line[m.end():])):
        return "steps", {"step": m.group(1), **dict(pairs)}
    return None  # a "[Step 2/5] building the dataset" banner without values is a script's stage, not a step


def _stdout(path: Path, how: Reading = Reading()) -> RunLog:
    """A console log. TRL prints no step number: its training dicts are numbered in order (each one a
    logging interval), an evaluation dict joins the training dict before it, the summary is dropped and
    ends that training: the next one's dicts are numbered from 1 again (an SFT stage, then GRPO, in one
    log: _fix_steps keeps the last). Where lines carry their step (verl, '[Step n]'), printed dicts are
    no training records: verl pretty-prints its config and its validation summaries as dicts. verl
    prints a step's last validation on a line of its own with the same step number: it joins that
    step's row."""
    with path.open(encoding="utf-8", errors="replace") as f:
        lines = [(bool(line.strip()), _stdout_record(line)) for line in f]  # [(has text, record or None)]
    stepped = any(rec is not None and rec[0] != "trl" for _, rec in lines)
    records, printers, skipped, dicts, joined = [], set(), 0, 0, 0
    trained = 0  # TRL dicts before the last summary
    for text, rec in lines:
        if rec is None:
            skipped += text
            continue
        printer, values = rec
        if printer == "trl":
            if stepped:
                dicts += 1
                continue
            if _TRL_SUMMARY & set(values):
                trained = len(records)
                continue
            if records and all(str(k).startswith("eval_") or k in ("epoch", "step") for k in values):
                records[-1].update(values)
                continue
            values = {"step": len(records) - trained + 1, **values}
        elif records and values["step"] == records[-1]["step"]:
            records[-1].update(values)
            joined += 1
            continue
        printers.add(printer)
        records.append(values)
    if not records:
        raise IngestError(f"{path}: no step lines (expected TRL's printed log dicts, verl's 'step:N - key:value' lines "
                          "or '[Step n/N] key=value' lines)")
    log = _table(path, records, "stdout", "line", how)
    log.notes.insert(0, f"console log ({', '.join(sorted(printers))} lines); {skipped} other lines skipped"
                     + (f"; {dicts} printed dicts skipped (config and validation summaries: the step lines carry the "
                        "metrics)" if dicts else "")
                     + (f"; {joined} lines joined the row of the step before them (same step number)" if joined else "")
                     + ("; TRL prints no step: rows are numbered in order, one a logging interval" if "trl" in printers else ""))
    return log


# transformers' NotebookProgressCallback draws the log as an HTML table in the cell's output, one row per
# logging step: <th>Step</th><th>Training Loss</th><th>reward</th>... ("rewards / fn" for "rewards/fn").
_HTML_ROW = re.compile(r"<tr>(.*?)</tr>", re.S)
_HTML_CELL = re.compile(r"<t[hd](?:\s[^>]*)?>(.*?)</t[hd]>", re.S)


def _notebook(path: Path, how: Reading = Reading()) -> RunLog:
    """A Jupyter notebook's saved outputs: the Trainer's progress table (Unsloth's GRPO notebooks ship
    with their own run's). The last table with a Step column is read: a re-run cell draws a new one."""
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise IngestError(f"{path}: not valid JSON ({e}); expected a Jupyter notebook (.ipynb)") from None
    cells = nb.get("cells") if isinstance(nb, dict) else None
    html = [h for c in cells or [] if isinstance(c, dict) for o in c.get("outputs") or [] if isinstance(o, dict)
            if "<table" in (h := "".join((o.get("data") or {}).get("text/html") or []))]
    tables = []
    for h in html:
        head, _, body = h.partition("</thead>")
        names = [re.sub(r"\s*/\s*", "/", n.strip()) for n in _HTML_CELL.findall(head)]
        if names and names[0].lower() == "step":
            rows = (dict(zip(names, (v.strip() for v in _HTML_CELL.findall(r)))) for r in _HTML_ROW.findall(body))
            tables.append(list(rows))
    if not tables or not tables[-1]:
        raise IngestError(f"{path}: no progress table with a Step column in the notebook's saved outputs (run the "
                          "training cell and save the notebook with its outputs)")
    log = _table(path, tables[-1], "notebook", how=how)
    log.notes.insert(0, f"the notebook's progress table ({len(tables)} drawn, the last read): one row per logging step")
    return log


# ---------------------------------------------------------------------------------------------
# Clean-up and derived series


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
    for name in ("sample_acc", "greedy_acc", "train_acc"):
        acc = log.series.get(name)
        if acc is None:
            continue
        finite = acc[np.isfinite(acc)]
        if len(finite) and finite.max() > 1.0 and finite.max() <= 100.0 and finite.min() >= 0:
            log.series[name] = acc / 100
            log.notes.append(f"{name} looked like a percentage (max > 1): divided by 100")


def _derive(log: RunLog) -> None:
    s = log.series
    # KL: a k3 estimate is >= 0 at every token; negative step means are a signed estimator (k1,
    # often on sequence sums): the window means still estimate KL, single steps are noise.
    if log.has("kl") and np.nanmin(s["kl"]) < -1e-9:
        log.kl_signed = True
        log.notes.append(f"kl has negative values (min {np.nanmin(s['kl']):.3g}): a signed estimator (k1), not k3; "
                         "window means are read as they are and 'KL ~ 0' is judged on their magnitude")
    _not_measured(log)
    components = {k[len("reward_"):]: v for k, v in s.items()
                  if k.startswith("reward_") and k != "reward_aux" and k not in ALIASES}  # reward_std is not a component
    if len(components) == 1:  # a sole component that is the reward (or the only reward the log has) is no part of a sum
        fn, v = next(iter(components.items()))
        if not log.has("reward") or np.allclose(v, s["reward"], atol=1e-6, equal_nan=True):
            if not log.has("reward"):
                s["reward"] = v.copy()
            log.notes.append(f"derived: reward_{fn} is the sole reward component and the reward itself (neither "
                             "auxiliary nor a part of a sum)")
            components = {fn: v} if component_kind(fn) == "correctness" else {}
    kinds = {fn: component_kind(fn) for fn in components}
    correctness = {fn: v for fn, v in components.items() if kinds[fn] == "correctness"}
    reward = s.get("reward", np.array([]))
    paid = bool(np.nan_to_num(reward).any())
    for fn, v in list(correctness.items()):
        finite = v[np.isfinite(v)]
        if paid and len(finite) and not finite.any():  # it never pays while the reward does: not the answers' truth
            del correctness[fn]
            log.notes.append(f"reward_{fn} is 0 on every row while the reward is not: not read as the correctness signal")
    aux = {fn: v for fn, v in components.items() if kinds[fn] == "auxiliary"}
    unclassified = [fn for fn in components if kinds[fn] == "unclassified"]
    if unclassified:
        log.reward_is_correctness = False
        log.notes.append(f"unclassified reward components: {', '.join('reward_' + fn for fn in unclassified)} (the name says "
                         "neither correctness nor form: read, summed nowhere; the combined reward is not judged as correctness)")
    if correctness and not log.has("train_acc"):
        fn, v = next(iter(correctness.items()))
        acc = _as_fraction(v)
        if acc is not None:
            s["train_acc"], payout = acc
            log.notes.append(f"derived: train_acc from the correctness component reward_{fn}"
                             + (f" divided by its payout {payout:g} (the smallest whole number at or above its largest step "
                                "mean: reward functions pay whole amounts)" if payout != 1 else "")
                             + " (saturation and hacking are judged on it)")
    if aux:
        s["reward_aux"] = np.sum([np.nan_to_num(v) for v in aux.values()], axis=0)
        s["reward_aux"][np.all([~np.isfinite(v) for v in aux.values()], axis=0)] = np.nan
        log.reward_is_correctness = False
        log.notes.append(f"derived: reward_aux = {' + '.join('reward_' + fn for fn in aux)} (auxiliary components)")
        if not correctness and not unclassified and not log.has("train_acc") and log.has("reward"):
            _split_combined(log)
    if log.has("reward"):
        top = float(np.nanmax(s["reward"]))
        if top > log.max_reward + 1e-9:
            maxima = [float(np.nanmax(v)) for v in components.values() if np.isfinite(v).any()]
            if components and sum(maxima) >= top - 1e-9:
                log.max_reward = float(sum(math.ceil(m - 1e-9) if m > 0 else 0 for m in maxima)) or top
                log.notes.append(f"the combined reward exceeds 1 (max {top:.3g}): its maximum is taken as "
                                 f"{log.max_reward:g}, the sum of the components' maxima")
            else:
                log.max_reward = top
                log.reward_scale_known = False
                log.notes.append(f"the combined reward exceeds 1 (max {top:.3g}) and the log does not say its maximum: "
                                 "saturation is judged on a correctness component only")
    if log.max_new_tokens is None:
        _infer_cap(log)
    if log.eval_n is None:
        _infer_eval_n(log)


# Columns that some runs log as exactly 0 on every row because nothing was computed: KL with beta = 0,
# entropy a trainer never computed, the GRPO loss with one update per batch (ratio 1 and advantages of
# mean 0 make its value 0 whatever the gradient). A constant 0 there is no measurement.
UNMEASURED_WHEN_ZERO = ("kl", "entropy", "entropy_norm", "loss", "clip_frac")


def _not_measured(log: RunLog) -> None:
    if log.format == "sentinel":  # our record leaves what it did not measure empty: its 0 is a measured 0
        return  # (clip_frac with mu = 1: one update a batch, the ratio exactly 1, nothing clipped)
    _loss_is_beta_kl(log)
    for name in UNMEASURED_WHEN_ZERO:
        v = log.series.get(name)
        if v is not None and np.isfinite(v).any() and not np.any(v[np.isfinite(v)] != 0):
            del log.series[name]
            log.notes.append(f"{name} is exactly 0 on every row: not measured (dropped; the rows that read it are not "
                             "assessable)")


# transformers logs the loss rounded to 4 decimals: a row's loss is known to within half that quantum.
_LOSS_QUANTUM = 1e-4


def _loss_is_beta_kl(log: RunLog) -> None:
    """TRL's GRPO loss with one update per batch: the policy term's value is 0 (the ratio is 1 and each
    group's advantages have mean 0), so the logged loss is beta x KL, a copy of the KL column scaled (as
    in every Unsloth notebook and TRL trainer_state.json with beta > 0 in the corpus). Read as a loss,
    KL's normal growth from 0 looks like a blow-up: when loss = b x kl on every row (b > 0, to within the
    rounding), the loss is dropped and said; the KL rows read what it carries."""
    s = log.series
    if not (log.has("loss") and log.has("kl")):
        return
    ok = np.isfinite(s["loss"]) & np.isfinite(s["kl"])
    loss, kl = s["loss"][ok], s["kl"][ok]
    if ok.sum() < 10 or np.ptp(loss) < 10 * _LOSS_QUANTUM or not (kl @ kl) > 0:
        return  # too few rows, or a loss that barely moves (within a few quanta): the fit would prove nothing
    b = float(loss @ kl / (kl @ kl))  # least squares through the origin; the rounding moves it by ~1 %
    if b > 0 and np.all(np.abs(loss - b * kl) <= _LOSS_QUANTUM / 2 + 1e-2 * np.abs(loss) + 1e-9):
        del s["loss"]
        log.notes.append(f"loss = {b:.3g} x kl on every row (to within its 4-decimal rounding): TRL's GRPO loss with "
                         "one update per batch is beta x KL, not a separate measurement (dropped; the loss rows are "
                         "not assessable, the KL rows read it)")


def _as_fraction(v: np.ndarray) -> tuple[np.ndarray, float] | None:
    """A correctness component as a fraction in [0, 1], and the payout it was divided by: a function
    that pays 2.0 per correct answer (Unsloth's notebooks) has step means in [0, 2]. None when it is
    negative somewhere (a penalty, not an acceptance rate)."""
    finite = v[np.isfinite(v)]
    if not len(finite) or finite.min() < 0:
        return None
    payout = float(max(1, math.ceil(finite.max() - 1e-9)))
    return v / payout, payout


def _split_combined(log: RunLog) -> None:
    """The book's combined reward, reward = correctness + weight x format: without a correctness
    column, reward - reward_aux is the correctness (weight 1, the book's default) when it stays a
    fraction on every row; otherwise the split is not made, and said."""
    s = log.series
    rest = s["reward"] - s["reward_aux"]
    finite = rest[np.isfinite(rest)]
    if len(finite) and finite.min() >= -1e-6 and finite.max() <= 1 + 1e-6:
        s["train_acc"] = np.clip(rest, 0, 1)
        log.notes.append("derived: train_acc = reward - reward_aux (the combined reward minus its auxiliary components; "
                         "a fraction on every row, so the auxiliary weight is 1)")
    else:
        log.notes.append("the combined reward minus its auxiliary components is not a fraction on every row (weighted "
                         "components?): correctness is not derived from it")


def _infer_eval_n(log: RunLog) -> None:
    """The evaluation's size from its accuracies, when the log does not say it: each is k/n correct, so
    the smallest n that makes every value a whole count (a divisor of the true n: the standard error it
    gives is never smaller than the true one). Five distinct values at least, or the fit proves nothing;
    rounded values (0.3333) fit no n up to 2,000 and nothing is inferred."""
    v = log.series.get("sample_acc")
    v = v[np.isfinite(v)] if v is not None else np.array([])
    if len(np.unique(v)) < 5 or v.min() < 0 or v.max() > 1:
        return
    n = next((n for n in range(2, 2001) if np.all(np.abs(v * n - np.round(v * n)) <= 1e-6 * n)), None)
    if n is not None:
        log.eval_n = n
        log.notes.append(f"derived: eval_n = {n}, inferred from sample_acc: every value is a whole number of {n} "
                         "problems (the smallest such n)")


def _infer_cap(log: RunLog) -> None:
    """max_new_tokens from the lengths, when they pile up at one ceiling: the largest value recurs
    exactly (a mean equal to the cap means every completion of the step was cut there) and nothing
    exceeds it. Three rows at the same maximum are not a coincidence for a continuous mean."""
    for name in ("response_len_max", "response_len"):
        if not log.has(name):
            continue
        v = log.series[name]
        v = v[np.isfinite(v)]
        top = float(v.max())
        at_top = int(np.sum(v == top))
        if at_top >= 3 and top >= 4 and float(top).is_integer():
            log.max_new_tokens = int(top)
            log.notes.append(f"derived: max_new_tokens = {int(top)}, inferred from {name}: {at_top} rows sit exactly at "
                             "its maximum (lengths pile up at the cap)")
            return
