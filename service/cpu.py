"""CPU threads for training processes that share a machine.

torch gives every process as many intra-op threads as the machine has cores, and its OpenMP threads spin
while they wait for work. Two such processes on the same cores spin against each other: on 2 cores two demo
runs went from 0.11 s a step alone to 0.47 s each, where with one thread each they kept 0.12 s
(benchmarks/bench_concurrent.py). So a training process takes its share of the cores it may use
(`os.sched_getaffinity`: a taskset, a cgroup's cpuset, a Kubernetes CPU limit), and the processes that train on
the same cores share them: each registers in a directory (`GRPO_SENTINEL_CPU_DIR`, default
/dev/shm/grpo-sentinel-cpu-<uid>) with a file it holds locked for its life, so a process that dies, however it dies,
leaves no claim behind; at each step boundary (at most once a second) it counts the live ones on its cores and
takes cores // count threads. Ranks of one run are processes like any other: two ranks on 2 cores get one each.

`run.cpu_threads` (a number) or the standard OMP_NUM_THREADS fixes the count instead; such a process still
registers, so the others leave it its share.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger(__name__)

DIR_ENV = "GRPO_SENTINEL_CPU_DIR"
RECHECK_S = 1.0  # how often a step boundary looks at the registry (a listdir and a lock probe per process)


def registry() -> Path:
    default = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    return Path(os.environ.get(DIR_ENV) or default / f"grpo-sentinel-cpu-{os.getuid()}")


def fixed_threads(setting: int | str) -> tuple[int, str] | None:
    """(threads, what set it) when the count is not ours to choose; None for 'auto'."""
    if setting != "auto":
        return int(setting), "run.cpu_threads"
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env), "OMP_NUM_THREADS"
    return None


class CpuShare:
    """This process's claim on its cores, and the thread count that follows from the others' claims."""

    def __init__(self, setting: int | str = "auto", folder: Path | None = None):
        self.cores = sorted(os.sched_getaffinity(0))
        self.fixed = fixed_threads(setting)
        self.folder = folder or registry()
        self.threads = 0
        self._before = torch.get_num_threads()  # given back on exit (a trainer inside a longer-lived process)
        self._fd: int | None = None
        self._checked = -RECHECK_S

    def __enter__(self) -> CpuShare:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            # Locked and written under a name no reader looks at, then renamed into place: a reader never
            # sees an unlocked claim of a live process (and would take it for a dead one's).
            staging = self.folder / f".{os.getpid()}.new"
            self._fd = os.open(staging, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            os.write(self._fd, json.dumps({"cores": self.cores}).encode())
            os.replace(staging, self.folder / f"{os.getpid()}.json")
        except OSError as e:  # no shared directory: alone as far as we know, which was torch's default anyway
            log.warning("cpu: cannot register in %s (%s); threads are chosen as if alone", self.folder, e)
            self._close()
        self.adjust(force=True)
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self._before)
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.folder / f"{os.getpid()}.json")
        self._close()

    def spare_core(self) -> int | None:
        """A core to give a helper process (vLLM's CPU worker) if this process may use more than one: its last."""
        return self.cores[-1] if len(self.cores) > 1 else None

    def give_up(self, core: int) -> None:
        """Leave `core` to the helper now bound to it: every thread of this process (OpenMP's pool included) moves
        to the other cores, the claim says so, and the thread count follows."""
        self.cores = [c for c in self.cores if c != core]
        for tid in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(tid), self.cores)
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, json.dumps({"cores": self.cores}).encode(), 0)
        self.adjust(force=True)

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None

    def adjust(self, force: bool = False) -> int:
        """Set torch's intra-op threads to this process's share now; called at step boundaries."""
        now = time.monotonic()
        if not force and now - self._checked < RECHECK_S:
            return self.threads
        self._checked = now
        if self.fixed is not None:
            threads, why = self.fixed
        else:
            sharing = self._sharing()
            threads = max(1, len(self.cores) // (1 + sharing))
            why = f"{len(self.cores)} core(s)" + (f" shared with {sharing} other training process(es)" if sharing else "")
        if threads != self.threads:
            (log.warning if self.threads and threads < self.threads else log.info)(
                "cpu: %d intra-op thread(s) (%s)%s", threads, why,
                "" if self.fixed else "; run.cpu_threads or OMP_NUM_THREADS sets the count")
            torch.set_num_threads(threads)
            self.threads = threads
        return threads

    def _sharing(self) -> int:
        """Live registered processes other than this one whose cores overlap ours."""
        if self._fd is None:
            return 0
        mine, others = set(self.cores), 0
        try:
            entries = list(self.folder.glob("*.json"))
        except OSError:
            return 0
        for path in entries:
            if path.stem == str(os.getpid()):
                continue
            cores = _live_claim(path)
            if cores is None:
                with contextlib.suppress(OSError):
                    path.unlink()  # its process is gone (the lock died with it)
            elif mine & cores:
                others += 1
        return others


def _live_claim(path: Path) -> set[int] | None:
    """The cores a registered process claims while it lives; None once it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return set()  # removed as we looked: not counted, not cleaned
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:  # held: alive
            try:
                return set(json.loads(os.read(fd, 1 << 16) or b"{}").get("cores", []))
            except ValueError:
                return set()  # being written: alive, cores not yet known
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
