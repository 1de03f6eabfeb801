"""The telemetry files of a run directory, written the same way by any trainer, ours or not (the TRL
callback), through telemetry/session.py: `run.json` (the RunInfo and its scales, written at each
start: what `diagnose` reads of a run besides its record), `summary.json` (the status file) and
`events.jsonl` (append-only history). The JSON files are rewritten atomically, so a reader never
sees half of one. And the one rule for a new run's default id.
"""

from __future__ import annotations

import errno
import functools
import json
from collections.abc import Iterator
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from grpo_sentinel.telemetry.schema import RunInfo

RUN_INFO = "run.json"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_summary(path: Path) -> dict:
    """The summary at `path`; {} when there is none. ValueError (with the reason) when it is corrupt."""
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path} is corrupt ({e})") from None
    if not isinstance(summary, dict):
        raise ValueError(f"{path} is corrupt (not an object)")
    return summary


def write_json(path: Path, data: dict) -> None:
    """Atomic (a new file renamed over the old). On a full disk a file that exists is rewritten in place,
    in the space the old one frees: the status (summary.json) must still be written then."""
    text = json.dumps(data, indent=2)
    tmp = path.with_suffix(".json.tmp")
    try:
        tmp.write_text(text)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not path.is_file():
            raise
        path.write_text(text)
        return
    tmp.replace(path)


def update_summary(path: Path, **fields: Any) -> dict:
    """Merge `fields` into the summary (a corrupt one is replaced), stamped `updated_at`."""
    try:
        summary = read_summary(path)
    except ValueError:
        summary = {}
    summary.update(fields, updated_at=now())
    write_json(path, summary)
    return summary


def event(path: Path, kind: str, **fields: Any) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"time": now(), "event": kind, **fields}) + "\n")


@functools.cache
def _run_info() -> TypeAdapter:
    return TypeAdapter(RunInfo)


def write_run_info(run_dir: Path, info: RunInfo) -> None:
    write_json(run_dir / RUN_INFO, asdict(info))


def read_run_info(path: Path) -> RunInfo:
    """The RunInfo a run.json holds, typed and range-checked; ValueError naming the file and each bad field."""
    try:
        return _run_info().validate_json(path.read_bytes())
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'the file'}: {err['msg']}" for err in e.errors())
        raise ValueError(f"{path}: not a run.json as telemetry writes it ({problems})") from None


def run_ids(seed: int, prefix: str = "") -> Iterator[str]:
    """A new run's default id: its start (local time, to the second) and seed, then `-2`, `-3`, ... for
    another run started in the same second; the caller takes the first one free. `prefix` says a
    trainer that is not ours (`trl-`)."""
    base = f"{prefix}{datetime.now():%Y%m%d-%H%M%S}-seed{seed}"
    yield base
    n = 2
    while True:
        yield f"{base}-{n}"
        n += 1


def new_run_id(parent: Path, seed: int, prefix: str = "") -> str:
    """The first default id with no directory under `parent` yet."""
    return next(i for i in run_ids(seed, prefix) if not (Path(parent) / i).exists())
