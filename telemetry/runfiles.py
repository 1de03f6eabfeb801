"""The status files of a run directory, written the same way by any trainer, ours or not (the TRL
callback): `summary.json` (the status file, rewritten atomically, so a reader never sees half of
it) and `events.jsonl` (append-only history).
"""

from __future__ import annotations

import errno
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


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


def write_summary(path: Path, summary: dict) -> None:
    """Atomic (a new file renamed over the old). On a full disk the one file that must still be written
    is the status: then it is rewritten in place, in the space the old one frees."""
    text = json.dumps(summary, indent=2)
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
    write_summary(path, summary)
    return summary


def event(path: Path, kind: str, **fields: Any) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"time": now(), "event": kind, **fields}) + "\n")
