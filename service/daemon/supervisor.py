"""The daemon's run queue, and the one training process it runs at a time.

The run directories under `<state>/runs/` are the source of truth: a run's directory is made (its
config validated and written, status `queued`) when it is submitted, and every later state is in its
`summary.json`, written by the training process itself. `<state>/queue.json` only keeps the order;
a corrupt one is set aside, reported, and the order rebuilt from the run directories, so no run is
ever silently dropped.

Each run trains in a child process (`grpo-sentinel train --resume <run dir>`), so a crash, an
out-of-memory kill or a hung library takes down that run only; the daemon marks it failed with its
error and goes on with the next. The child dies with the daemon (PR_SET_PDEATHSIG): a SIGKILLed
pod leaves no orphan holding the GPU, and the next start resumes the run from its newest complete
checkpoint before it takes new work. SIGTERM is forwarded: the child checkpoints at the step
boundary, and is killed only if it has not finished within the grace.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

from grpo_sentinel.service.config import Config
from grpo_sentinel.service.daemon import TOKEN_ENV
from grpo_sentinel.service.runs import EXIT_DISK, FINISHED, RunDir, RunDirError
from grpo_sentinel.telemetry import runfiles
from grpo_sentinel.telemetry.catalogue import DAEMON

log = logging.getLogger(__name__)

STATUSES = ("queued", "running", "completed", "stopped_early", "halted", "preempted", "stopped", "failed", "damaged")
INTERRUPTED = ("running", "preempted")  # found at start-up: resumed before anything new


def _die_with(parent: int):
    def preexec() -> None:
        """In the child, before exec: SIGKILL when the daemon's supervising thread ends (Linux)."""
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the daemon died before prctl took effect
            os._exit(1)
    return preexec


def _help(name: str) -> str:
    return next(d.description for d in DAEMON if d.name == name)


def ranks(nproc_per_node: int | str) -> int:
    if nproc_per_node != "auto":
        return nproc_per_node
    import torch

    return max(1, torch.cuda.device_count())


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class Child:
    run_id: str
    proc: subprocess.Popen | None = None  # None while the run is being started
    stop_requested: bool = False  # the API asked to stop it: it ends `stopped`, not queued for resume


class Supervisor:
    def __init__(self, state_dir: Path, grace_s: float = 30.0):
        self.state_dir = Path(state_dir).resolve()  # absolute: a run's process works in its own directory
        self.runs_dir = self.state_dir / "runs"
        self.grace_s = grace_s
        self._lock = threading.Condition()
        self._order: list[str] = []  # every known run, in submission order
        self._pending: list[str] = []  # runs to train, interrupted ones first
        self.child: Child | None = None
        self._closing = False
        self._worker: threading.Thread | None = None
        self.registry = CollectorRegistry()
        self.registry.register(_RunsByStatus(self))
        self._finished = Counter("grpo_runs_finished", _help("grpo_runs_finished_total"), ["status"], registry=self.registry)
        for s in FINISHED:
            self._finished.labels(s)

    # -- start-up and shutdown -----------------------------------------------------------------

    def start(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self._order = self._load_order()
        status = {rid: self.status(rid) for rid in self._order}
        self._pending = [r for r in self._order if status[r] in INTERRUPTED] + \
                        [r for r in self._order if status[r] == "queued"]
        if any(status[r] in INTERRUPTED for r in self._order):
            log.info("resuming interrupted run(s) first: %s", ", ".join(r for r in self._order if status[r] in INTERRUPTED))
        self._save_order()
        self._worker = threading.Thread(target=self._work, name="grpo-supervisor", daemon=True)
        self._worker.start()

    @property
    def ready(self) -> bool:
        return self._worker is not None and self._worker.is_alive() and not self._closing

    def shutdown(self) -> None:
        """SIGTERM to the training process, which checkpoints and exits; SIGKILL if it outlives the grace.
        Either way the run is resumed at the next start."""
        with self._lock:
            self._closing = True
            child = self.child
            self._lock.notify_all()
        if child is not None and child.proc is not None and child.proc.poll() is None:
            log.info("stopping run %s: checkpoint at the step boundary (grace %.0f s)", child.run_id, self.grace_s)
            if not child.stop_requested:  # a second SIGTERM would make it stop at once, without its checkpoint
                child.proc.send_signal(signal.SIGTERM)
            try:
                child.proc.wait(timeout=max(1.0, self.grace_s - 3))  # keep a few seconds for our own exit
            except subprocess.TimeoutExpired:
                log.warning("run %s did not stop within the grace; killed (it resumes from its newest checkpoint)",
                            child.run_id)
                child.proc.kill()
                child.proc.wait()
        if self._worker is not None:
            self._worker.join(timeout=5)

    # -- the API's operations ------------------------------------------------------------------

    def submit(self, cfg: Config) -> str:
        """Queue a run (a validated config); returns its id. Under the daemon a run serves its metrics on
        loopback only (the daemon's /metrics carries them) and lives in the state directory. All or
        nothing: if any write fails (a full volume), the run directory is removed and nothing is queued."""
        cfg = cfg.model_copy(deep=True)
        cfg.telemetry.prometheus_host, cfg.telemetry.prometheus_port = "127.0.0.1", 0
        with self._lock:
            run_id = cfg.run.run_id or runfiles.new_run_id(self.runs_dir, cfg.run.seed)
            cfg.run.run_id, cfg.run.out_dir = run_id, str(self.runs_dir)
            if run_id in self._order:
                raise RunDirError(f"run {run_id!r} already exists")
            run = RunDir.new(self.runs_dir, run_id, cfg)
            try:
                run.write_summary({"status": "queued", "step": 0, "steps": cfg.run.steps, "submitted_at": _now()})
                self._save_order([*self._order, run_id])
            except BaseException:
                run.unlock()
                shutil.rmtree(run.path, ignore_errors=True)
                raise
            run.unlock()  # the training process takes it when the run starts
            self._order.append(run_id)
            self._pending.append(run_id)
            self._lock.notify_all()
        log.info("run %s queued (%d ahead of it)", run_id, len(self._pending) - 1 + (self.child is not None))
        return run_id

    def stop(self, run_id: str) -> str:
        """A queued run is removed; the running one checkpoints and ends `stopped`. Returns what happened."""
        with self._lock:
            if run_id in self._pending:
                self._pending.remove(run_id)
                self._order.remove(run_id)
                self._save_order()
                shutil.rmtree(self.runs_dir / run_id, ignore_errors=True)
                log.info("run %s removed from the queue (stopped through the API before it started)", run_id)
                return "removed"
            child = self.child
            if child is not None and child.run_id == run_id:
                child.stop_requested = True  # wins over the signal it sends, however early that lands
                if child.proc is not None:
                    RunDir(self.runs_dir / run_id).mark_stop("stopped through the API")  # in the run's own words too
                    child.proc.send_signal(signal.SIGTERM)
                log.info("run %s: stopping through the API (it checkpoints at its step boundary)", run_id)
                return "stopping"
        return self.status(run_id)

    def resume(self, run_id: str) -> str:
        """Queue a failed run again (e.g. after its disk was freed): it continues from its newest checkpoint."""
        with self._lock:
            status = self.status(run_id)
            if status != "failed" or run_id in self._pending or (self.child and self.child.run_id == run_id):
                raise RunDirError(f"run {run_id!r} is {status}: only a failed run can be resumed")
            RunDir(self.runs_dir / run_id).update_summary(status="queued", reason="")
            self._pending.append(run_id)
            self._lock.notify_all()
        log.info("run %s queued again (resume)", run_id)
        return "queued"

    def run_ids(self) -> list[str]:
        with self._lock:
            return list(self._order)

    def run_dir(self, run_id: str) -> RunDir | None:
        return RunDir(self.runs_dir / run_id) if run_id in self._order else None

    def status(self, run_id: str) -> str:
        summary = self._summary(run_id)
        return "damaged" if summary is None else summary.get("status", "queued")  # unreadable: not runnable

    # -- the worker ----------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing:
                    self._lock.wait()
                if self._closing:
                    return
                run_id = self._pending.pop(0)
                self.child = Child(run_id)  # from here a stop request is this run's
            try:
                self._train(run_id)
            except Exception as e:  # noqa: BLE001 - one run's trouble never takes the service down
                log.exception("run %s: the supervisor failed to run it", run_id)
                try:
                    RunDir(self.runs_dir / run_id).update_summary(status="failed",
                                                                   reason=f"the daemon could not start it: {e}")
                except OSError as write:
                    log.error("run %s: cannot record its failure (%s)", run_id, write)
                self._finished.labels("failed").inc()
            finally:
                with self._lock:
                    self.child = None

    def _train(self, run_id: str) -> None:
        run_dir = self.runs_dir / run_id
        # A training process killed with the previous daemon may take a moment to die and let go of the run.
        if not RunDir(run_dir).wait_unlocked(timeout=30):
            raise RunDirError(f"run {run_id} is held by {RunDir(run_dir).holder()}")
        run = RunDir(run_dir)
        attempts = run.read_summary().get("attempt", 0)
        cmd = ["-m", "grpo_sentinel.service.cli", "train", "--resume", str(run_dir)]
        n = ranks(run.read_config().distributed.nproc_per_node)
        if n > 1:  # torch's own elastic launcher starts and watches the ranks; it forwards our SIGTERM
            cmd = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *cmd]
        cmd = [sys.executable, *cmd]
        with self._lock:
            child = self.child
            if child.stop_requested:  # stopped before it started: nothing ran, nothing to resume
                run.update_summary(status="stopped", reason="stopped through the API before it started")
                self._finished.labels("stopped").inc()
                return
            with (run_dir / "train.log").open("ab") as out:
                # The API token is the daemon's: a run (and the reward code it imports) never needs it. The
                # run works in its own directory: what its code writes lands there, not in the daemon's.
                env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
                child.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir,
                                              preexec_fn=_die_with(os.getpid()), env={**env, "PYTHONUNBUFFERED": "1"})
        log.info("run %s: training on %d rank(s) (pid %d, log %s)", run_id, n, child.proc.pid, run_dir / "train.log")
        rc = child.proc.wait()
        with self._lock:
            closing = self._closing
        self._settle(run_id, rc, child.stop_requested, closing, attempts)

    def _settle(self, run_id: str, rc: int, stop_requested: bool, closing: bool, attempts: int) -> None:
        """What the training process's exit means for the run. A finished status in the run's own summary
        wins over everything (a signal in the moment after it was written changes nothing); before a start
        the summary is never finished. Under torch's launcher the exit code is only 0 or 1 whatever the
        ranks returned, so the summary is read first; a stop through the API wins over the signal it sent."""
        run = RunDir(self.runs_dir / run_id)
        summary = run.read_summary()
        status = summary.get("status", "running")
        if status not in FINISHED and summary.get("attempt", 0) == attempts:
            status = "running"  # this start never got to say (a "preempted" is the previous attempt's)
        if rc == EXIT_DISK:  # the run's own advice names the CLI; under the daemon it is the resume call
            status = "failed"
            run.update_summary(status="failed", reason=self._why(run_id, rc))
        elif status in FINISHED:
            pass
        elif stop_requested:
            status = "stopped"
            run.update_summary(status="stopped", reason="stopped through the API")
        elif status == "preempted" or rc == 75 or (closing and rc < 0):  # a signal's checkpoint, or the grace ran out
            if closing:
                status = "preempted"
                run.update_summary(status="preempted", reason="the daemon stopped; it resumes at the next start")
            else:  # a signal from elsewhere: train on
                with self._lock:
                    self._pending.insert(0, run_id)
                return
        else:  # it never got to say
            status = "failed"
            run.update_summary(status="failed", reason=self._why(run_id, rc))
        self._finished.labels(status).inc()
        log.log(logging.ERROR if status == "failed" else logging.INFO, "run %s: %s%s", run_id, status,
                f" ({run.read_summary().get('reason')})" if status == "failed" else "")

    def _why(self, run_id: str, rc: int) -> str:
        if rc == EXIT_DISK:  # its own summary and log may not have fitted on the disk either
            return (f"the disk under the run is full (exit {EXIT_DISK}): free space, then POST "
                    f"/v1/runs/{run_id}/resume (it continues from its newest checkpoint)")
        if rc < 0:
            name = signal.Signals(-rc).name
            return f"the training process was killed by {name}" + (" (out of memory?)" if rc == -signal.SIGKILL else "")
        lines = [ln for ln in (self.runs_dir / run_id / "train.log").read_text(errors="replace").splitlines() if ln.strip()]
        said = next((ln for ln in reversed(lines) if ln.startswith("grpo-sentinel:")), lines[-1] if lines else "")
        return f"the training process exited with code {rc}" + (f": {said.removeprefix('grpo-sentinel: ')}" if said else "")

    # -- persistence and metrics ---------------------------------------------------------------

    def _load_order(self) -> list[str]:
        path = self.state_dir / "queue.json"
        order: list[str] = []
        if path.exists():
            try:
                data = json.loads(path.read_text())
                order = [str(r) for r in data["order"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                aside = path.with_name(f"queue.json.corrupt-{int(time.time())}")
                path.rename(aside)
                log.error("%s is corrupt (%s): kept as %s; the order is rebuilt from the run directories", path, e, aside)
        # Runs on disk the queue does not list (a lost write, a rebuilt queue): appended in submission
        # order, never dropped.
        known = set(order)
        found = [d.name for d in self.runs_dir.iterdir() if d.is_dir() and (d / "config.yaml").is_file() and d.name not in known]
        found.sort(key=lambda r: (self._summary(r) or {}).get("submitted_at", ""))
        if found and path.exists():
            log.warning("runs not in the queue file, added in submission order: %s", ", ".join(found))
        return [r for r in order if (self.runs_dir / r).is_dir()] + found

    def _summary(self, run_id: str) -> dict | None:
        """The run's summary.json; None when it is corrupt."""
        try:
            return RunDir(self.runs_dir / run_id).read_summary()
        except RunDirError:
            return None

    def _save_order(self, order: list[str] | None = None) -> None:
        path = self.state_dir / "queue.json"
        tmp = path.with_suffix(".json.tmp")
        try:
            with tmp.open("w") as f:
                json.dump({"version": 1, "order": self._order if order is None else order}, f)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise



class _RunsByStatus:
    """`grpo_runs{status}`, counted from the run directories at each scrape (never stale)."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def collect(self):
        counts = dict.fromkeys(STATUSES, 0)
        for r in self.supervisor.run_ids():
            s = self.supervisor.status(r)
            counts[s if s in counts else "failed"] += 1
        g = GaugeMetricFamily("grpo_runs", _help("grpo_runs"), labels=["status"])
        for s, n in counts.items():
            g.add_metric([s], n)
        yield g
