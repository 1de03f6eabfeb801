"""A run's history as a stream, read from its run directory: what `GET /v1/runs/{id}/events` sends.

The run directory is the source of truth (the daemon may have restarted since the run began), so the
stream is read from its files: `summary.json` (the status), `events.jsonl` (append-only: created,
started, resumed, config_changed, ended) and `steps.csv` (a row per step, appended; a resume rewrites
it without the rows past its checkpoint and redoes them). A cursor says what a follower has seen: the
last step sent and how many events; one that reconnects with it is sent neither a step nor an event
twice, across a daemon restart or a resume that redid steps.
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from grpo_sentinel.telemetry import runfiles


@dataclass(frozen=True)
class Cursor:
    step: int = 0  # the last step row sent
    events: int = 0  # events.jsonl lines sent

    def __str__(self) -> str:  # the SSE id, which a reconnecting follower sends back as Last-Event-ID
        return f"{self.step}-{self.events}"

    @classmethod
    def parse(cls, text: str | None) -> Cursor:
        """The cursor an id names; ValueError for text that is not one (`12-3`)."""
        if text is None:
            return cls()
        m = re.fullmatch(r"(\d{1,12})-(\d{1,12})", text.strip())
        if m is None:
            raise ValueError(f"Last-Event-ID {text!r} is not an id this stream sent (STEP-EVENTS, e.g. 12-3)")
        return cls(int(m[1]), int(m[2]))


class _Appended:
    """The complete lines a file gained since the last call. A file replaced since (a new inode: a resume
    rewrote steps.csv) is read again from its start, and says so."""

    def __init__(self, path: Path):
        self.path = path
        self._inode: int | None = None
        self._offset = 0

    def read(self) -> tuple[bool, list[str]]:
        """(read from the start, the new complete lines); a torn last line waits for its end."""
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                fresh = st.st_ino != self._inode or st.st_size < self._offset
                if fresh:
                    self._inode, self._offset = st.st_ino, 0
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return False, []
        whole = chunk[: chunk.rfind(b"\n") + 1]
        self._offset += len(whole)
        return fresh, whole.decode(errors="replace").splitlines()


class RunTail:
    """What a follower of one run has not been sent yet, as (kind, data, cursor after it), oldest first:
    `status` {status, step, steps, attempt} when it changes (`damaged`: summary.json is unreadable);
    `event` an events.jsonl entry; `step` a steps.csv row (text, as recorded); `condition` {id, step} for
    each health condition that begins at a step (active there, not at the step before: the monitor's own
    definition of a new episode)."""

    def __init__(self, run_dir: Path, since: Cursor = Cursor()):
        self.cursor = since
        self._summary_path = run_dir / "summary.json"
        self._events, self._steps = _Appended(run_dir / "events.jsonl"), _Appended(run_dir / "steps.csv")
        self._events_read = 0
        self._header: list[str] = []
        self._health: set[str] = set()  # the conditions active at the newest row read
        self._status: dict | None = None
        self._unreadable = 0  # polls in a row that found summary.json unreadable

    def poll(self) -> tuple[list[tuple[str, dict, Cursor]], dict]:
        """Everything new since the last poll, and the summary as it was before the files were read (so
        a summary that says the run has ended comes with every row and event it wrote before that)."""
        try:
            summary = runfiles.read_summary(self._summary_path)
            self._unreadable = 0
        except ValueError as e:  # caught mid-write (rewritten in place on a full disk), or damaged: twice running
            self._unreadable += 1
            summary = {**(self._status or {}), **({"status": "damaged", "reason": str(e)} if self._unreadable > 1 else {})}
        out: list[tuple[str, dict, Cursor]] = []
        status = {"status": summary.get("status", "queued"), "step": summary.get("step", 0),
                  "steps": summary.get("steps", 0), "attempt": summary.get("attempt", 0)}
        if status != self._status:
            self._status = status
            out.append(("status", status, self.cursor))
        events = self._new_events()  # events first: a step row read after them was written after them
        steps = self._new_rows()
        # Merged by step: an event at step s (a start, a resume, an end) comes after row s, before row s+1.
        while events or steps:
            if events and (not steps or events[0].get("step", -1) < int(steps[0][0]["step"])):
                self.cursor = Cursor(self.cursor.step, self.cursor.events + 1)
                out.append(("event", events.pop(0), self.cursor))
            else:
                row, begun = steps.pop(0)
                self.cursor = Cursor(int(row["step"]), self.cursor.events)
                out.append(("step", row, self.cursor))
                out += [("condition", {"id": c, "step": self.cursor.step}, self.cursor) for c in begun]
        return out, summary

    def _new_events(self) -> list[dict]:
        out = []
        for line in self._events.read()[1]:
            self._events_read += 1
            if self._events_read > self.cursor.events:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    out.append({"event": "unreadable", "line": line})  # counted all the same: the cursor stays true
        return out

    def _new_rows(self) -> list[tuple[dict, list[str]]]:
        """The rows past the cursor, each with the conditions that begin at it."""
        fresh, lines = self._steps.read()
        if fresh:
            self._health = set()
            self._header, lines = (next(csv.reader(lines[:1])), lines[1:]) if lines else ([], [])
        out = []
        for values in csv.reader(lines):
            row = dict(zip(self._header, values))
            health = set(row.get("health", "").split())
            begun, self._health = sorted(health - self._health), health
            if row.get("step", "").isdigit() and int(row["step"]) > self.cursor.step:
                out.append((row, begun))
        return out
