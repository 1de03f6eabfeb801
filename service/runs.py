"""Run directories: where a run lives, who holds it, what state it is in, and whether a resume may
change its config. The CLI and the daemon both go through here.

A run directory holds `config.yaml` (what the run uses: the service's own file, read by nothing in
telemetry), `run.json` (the scales telemetry persists at each start: what `diagnose` reads),
`summary.json` (its status, rewritten atomically at start and end: the status file), `events.jsonl`
(starts, resumes, config changes, ends: append-only), the two CSVs and `checkpoints/`, and while a stop
through the daemon's API is on its way, `stop-requested` (the signal says "stop", the file says "for good"). Reading a
run (`read_config`, `read_summary`, `events`) validates its config purely, never whether it could
launch: a finished run still reads after its model or data moved (launch.py is the launch's check).
While a process trains it, it holds an exclusive lock on `.lock` (flock: the kernel releases it when
the process dies, however it dies, so a lock left by a killed process is never mistaken for a live
one); the file names the holder.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_sentinel.service.config import Config, ConfigError, validate
from grpo_sentinel.telemetry import runfiles

# Fields a resume may change: they change neither what the recorded steps mean nor the shape of the
# checkpoint (how long to train, how often to evaluate and checkpoint, where and on how many ranks it
# runs, how it is watched). Everything else (model, data, rewards, the GRPO and optimiser settings, the seeds) would
# make the earlier rows of the record lie about the run, or not fit the checkpoint.
RESUMABLE = ("run.steps", "run.sample_every", "run.checkpoint_every", "run.keep_checkpoints",
             "run.max_consecutive_faults", "run.cpu_threads", "model.device", "grpo.micro_batch_size", "grpo.reward_timeout_s",
             "grpo.reward_workers", "telemetry.", "health.", "traces.", "distributed.")


# How a run can end; a run with one of these in its summary is never trained again by itself.
FINISHED = ("completed", "stopped_early", "halted", "stopped", "failed")

# Exit codes (README, "Crashes, preemption, bad input"), by the status a run ends with: 75 = EX_TEMPFAIL,
# run me again with --resume. 74 = EX_IOERR: the disk under the run directory is full (free space, then run
# again / --resume). Here, with the run directory, so that the CLI gives them (at start-up, and following
# a run on the daemon) without importing the trainer (torch).
EXIT_CODES = {"completed": 0, "stopped_early": 0, "halted": 3, "preempted": 75, "stopped": 75, "failed": 1}
EXIT_DISK = 74


STOP_MARK = "stop-requested"


class RunDirError(ValueError):
    """The run directory cannot be used as asked; the message says why and what to do."""


class RunLocked(RunDirError):
    pass


class Interrupted(BaseException):
    """Raised by an entry point's signal handler to stop at once (a signal outside the training loop,
    or a second one inside it); the newest complete checkpoint is the resume point. (Here, not with
    the trainer: the handler is installed before torch is imported.)"""


def flat(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; lists stay values."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_changes(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    a, b = flat(old.model_dump(mode="json")), flat(new.model_dump(mode="json"))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def resumable(key: str) -> bool:
    return any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESUMABLE)


@dataclass
class RunDir:
    path: Path
    created: bool = False  # this process made the directory (a failed start removes it again)
    _lock_fd: int | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    # -- new runs and resumes -------------------------------------------------------------------

    @classmethod
    def new(cls, parent: Path, run_id: str, cfg: Config) -> RunDir:
        """A fresh run directory, locked, holding the config; refused if the run id is taken."""
        path = Path(parent) / run_id
        if path.exists() and not path.is_dir():
            raise RunDirError(f"{path} exists and is not a directory: pick another run.run_id or --out")
        if (path / "config.yaml").exists():
            raise RunDirError(f"run directory {path} already exists: pick another run.run_id, or --resume it")
        existed = path.is_dir()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunDirError(f"cannot create the run directory {path}: {e.strerror} (check --out / run.out_dir)") from None
        run = cls(path, created=not existed)
        try:
            run.lock()
            run.config_path.write_text(cfg.to_yaml())
            run.event("created", steps=cfg.run.steps)
        except BaseException:  # even a signal: no half-made run directory is left behind
            run.discard()
            raise
        return run

    @classmethod
    def resume(cls, path: Path, overrides: list[str], steps: int | None) -> tuple[RunDir, Config]:
        """The run at `path` with its own config, changed only where a resume may change it. Refuses,
        touching nothing, a directory that is not an intact run record or a change that would
        rewrite its meaning; allowed changes are written to the config and recorded as an event."""
        run, saved, cfg = cls._resumable(Path(path), overrides, steps)
        run.lock()
        if run.read_summary().get("status") in FINISHED:  # asked for by name: an earlier stop is not this start's
            (run.path / STOP_MARK).unlink(missing_ok=True)
        changes = config_changes(saved, cfg)
        if changes:
            run.config_path.write_text(cfg.to_yaml())
            run.event("config_changed", changes={k: list(v) for k, v in changes.items()})
        return run, cfg

    @classmethod
    def resume_config(cls, path: Path, overrides: list[str], steps: int | None) -> Config:
        """The config a resume would continue with, checked like `resume`, touching nothing (what the
        other ranks of a multi-process run read while rank 0 takes the run)."""
        return cls._resumable(Path(path), overrides, steps)[2]

    @classmethod
    def _resumable(cls, path: Path, overrides: list[str], steps: int | None) -> tuple[RunDir, Config, Config]:
        from grpo_sentinel.service.config import load_config

        if not path.is_dir():
            raise RunDirError(f"--resume {path}: no such run directory")
        run = cls(path)
        if not run.config_path.is_file():
            raise RunDirError(f"--resume {path}: no config.yaml there; is it a run directory?")
        saved = run.read_config()
        run.read_summary()  # a corrupt summary is reported here, before anything is touched
        cfg = load_config(run.config_path, overrides, **{"run.steps": steps})
        refused = {k: v for k, v in config_changes(saved, cfg).items() if not resumable(k)}
        if refused:
            lines = "\n".join(f"  - {k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
            raise RunDirError(f"--resume {path}: these changes would rewrite what the recorded steps mean or not fit "
                              f"the checkpoint, so the run cannot continue with them:\n{lines}\n"
                              "Start a new run for them (resumable: " + ", ".join(RESUMABLE) + ")")
        if (path / "checkpoints").is_dir() and any((path / "checkpoints").glob("step-*")):
            if not (path / "steps.csv").is_file():
                raise RunDirError(f"--resume {path}: the run has checkpoints but no steps.csv: its record is damaged; "
                                  "restore steps.csv or start a new run")
        return run, saved, cfg

    def discard(self) -> bool:
        """Undo a start that ended before the run trained a step (only a directory this process made)."""
        steps = self.path / "steps.csv"
        trained = (steps.is_file() and steps.read_text(errors="replace").count("\n") > 1) or \
            any((self.path / "checkpoints").glob("step-*"))
        if not self.created or trained:
            return False
        self.unlock()
        shutil.rmtree(self.path, ignore_errors=True)
        return True

    # -- files ---------------------------------------------------------------------------------

    def read_config(self) -> Config:
        try:
            text = self.config_path.read_text()
            raw = yaml.safe_load(text) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise RunDirError(f"{self.config_path}: unreadable ({e}); the run record is damaged") from None
        if not isinstance(raw, dict):
            raise RunDirError(f"{self.config_path}: not a config mapping; the run record is damaged")
        try:
            return validate(raw)
        except ConfigError as e:
            raise RunDirError(f"{self.config_path}: {e}") from None

    def read_summary(self) -> dict:
        try:
            return runfiles.read_summary(self.summary_path)
        except ValueError as e:
            raise RunDirError(f"{e}: move it away to resume from the checkpoints") from None

    def write_summary(self, summary: dict) -> None:
        runfiles.write_json(self.summary_path, summary)

    def update_summary(self, **fields: Any) -> dict:
        """Merge `fields` into the summary (e.g. a failure's status and reason), keeping the rest."""
        return runfiles.update_summary(self.summary_path, **fields)

    def mark_stop(self, reason: str) -> None:
        """Before the signal that stops it: the run ends `stopped` (for good), not `preempted` (resume me),
        for `reason`. One word from the process that trains it, in its summary, its events and its exit,
        whenever the signal lands; a later resume by name clears it."""
        (self.path / STOP_MARK).write_text(reason + "\n")

    @property
    def stop_marked(self) -> str | None:
        """Why the run was stopped for good, if it was (mark_stop)."""
        try:
            return (self.path / STOP_MARK).read_text().strip() or "stopped"
        except OSError:
            return None

    def event(self, kind: str, **fields: Any) -> None:
        runfiles.event(self.path / "events.jsonl", kind, **fields)

    def events(self) -> list[dict]:
        """The run's events; a torn or damaged line (a crash mid-append) becomes an `unreadable` event."""
        path = self.path / "events.jsonl"
        try:
            lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        except OSError as e:
            return [{"event": "unreadable", "detail": f"{path.name}: {e.strerror or e}"}]
        out = []
        for n, line in enumerate(lines, 1):
            try:
                event = json.loads(line) if line.strip() else {}
            except ValueError:
                event = None
            if not isinstance(event, dict):  # said in place of the line, so a reader sees the gap
                event = {"event": "unreadable", "line": n, "detail": "not a JSON event (a torn write?): skipped"}
            if event:
                out.append(event)
        return out

    # -- the lock ------------------------------------------------------------------------------

    def lock(self) -> None:
        """Hold the run exclusively; RunLocked names the holder if another process has it."""
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise RunLocked(f"run {self.path} is being trained by {self.holder() or 'another process'}: "
                            "stop that one first (a killed process releases the lock by itself)") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": runfiles.now()}).encode())
        self._lock_fd = fd

    def holder(self) -> str:
        try:
            h = json.loads((self.path / ".lock").read_text())
            return f"pid {h['pid']} on {h['host']} (since {h['since']})"
        except (OSError, ValueError, KeyError, TypeError):
            return ""

    def wait_unlocked(self, timeout: float) -> bool:
        """True once no process holds the run (or within `timeout` seconds, False)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.lock()
            except RunLocked:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
            else:
                self.unlock()
                return True

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

