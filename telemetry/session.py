"""The telemetry half of one run, built once: what our Trainer (service/trainer.py) and the TRL
callback (integrations/trl.py) both hold, in the one process that reports (rank 0; other ranks hold
none, so exactly one process writes the record, serves /metrics and sends traces).

A `RunSession` owns
- the sinks: the run record (record.py), the trainer's own (OpenTelemetry, a progress line) and the
  Langfuse traces, and the health monitor;
- the per-step pipeline, `step()`: the health verdict, stamped on the record, then the traces planned
  (the verdict's conditions choose some of the generations), then every sink; and `baseline()`, the
  step-0 evaluation (traced, curve row 0, the monitor's accuracy reference);
- the run's bookkeeping (`Book`: the baseline and the newest evaluation, each health condition's first
  step, the invalid rewards), which a trainer that checkpoints saves with its own state;
- the run directory's telemetry files (runfiles.py): `run.json` (the RunInfo and its Scales, written
  at each start: what `diagnose` reads of the run besides its record), `summary.json` and
  `events.jsonl`.

The rules both trainers follow are here once: the largest reward (`max_reward`), the detectors' window
(health.thresholds.detector_window), and `run_scales`, which applies them. The run id's rule is runfiles.run_ids.

The trainer keeps the model, the step, checkpoints and ranks; the callback keeps the mapping of TRL's
logs. A sink's failure goes through `guard`: ours raises on a full disk (the run ends, its newest
checkpoint kept); the default, the callback's, logs the first failure, counts each (summary.json's
telemetry_errors) and lets training go on.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from grpo_sentinel.telemetry import runfiles
from grpo_sentinel.telemetry.drops import DROPS
from grpo_sentinel.telemetry.health import ingest
from grpo_sentinel.telemetry.health.monitor import HealthMonitor, Verdict
from grpo_sentinel.telemetry.health.thresholds import configured, detector_window
from grpo_sentinel.telemetry.record import RunRecord
from grpo_sentinel.telemetry.schema import Eval, RunInfo, Scales, StepStats
from grpo_sentinel.telemetry.settings import HealthSettings

if TYPE_CHECKING:
    from grpo_sentinel.telemetry.traces import TraceSink

log = logging.getLogger(__name__)


class StepSink(Protocol):
    """A backend of the per-step record (CSV, OpenTelemetry, traces, a progress line): the trainer
    never knows which are attached."""

    def start(self, info: RunInfo) -> None: ...

    def on_step(self, stats: StepStats) -> None: ...

    def close(self) -> None: ...


def max_reward(weights: Iterable[float]) -> float:
    """The largest combined reward: the sum of the positive weights (reward functions score 0..1), at
    least 1."""
    return max(1.0, sum(max(float(w), 0.0) for w in weights))


def run_scales(*, ln_vocab: float, max_new_tokens: int, group_size: int, prompts_per_step: float,
               rewards: Sequence[tuple[str, float]], window: int | None = None, steps_per_row: int = 1,
               largest_reward: float | None = None, thresholds: Mapping[str, float] | None = None) -> Scales:
    """A run's Scales from its settings. rewards: (function, weight) in the record's order; window: the
    configured one, if any; steps_per_row: optimizer steps a record row covers (TRL's logging_steps);
    largest_reward: the user's own figure, if given; thresholds: the ones its config changed."""
    return Scales(max_reward=largest_reward or max_reward(w for _, w in rewards), ln_vocab=ln_vocab,
                  max_new_tokens=max_new_tokens, group_size=group_size, prompts_per_step=prompts_per_step,
                  window=detector_window(window, group_size * prompts_per_step * steps_per_row),
                  reward_weights=dict(rewards), thresholds=dict(thresholds or {}))


@dataclass
class Book:
    """What a run keeps across its steps for its summary. The field names are our checkpoints' (a
    resume continues the book)."""

    baseline: dict | None = None  # accuracy before training (step 0), as summary.json says it
    last_eval: dict | None = None  # the newest evaluation (the baseline until another)
    last_eval_step: int = 0
    conditions: dict[str, int] = field(default_factory=dict)  # health condition -> first step it was active
    invalid_rewards: int = 0  # reward calls that raised or gave None/NaN/inf


def _accuracy(ev: Eval) -> dict:
    """An evaluation's figures for summary.json (strict JSON: what was not measured is null)."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in ev.accuracy().items()}


class RunSession:
    """One run's telemetry in the reporting process (see the module docstring).

    run_dir: the run directory; steps: the optimizer steps the run is to train; world_size: training
    processes; sinks, traces: the backends besides the record (traces: also the planner of each step's
    traces); health: the monitor's settings; origin: what summary.json and the start event say of a
    trainer that is not ours ({"trainer": "trl", ...}); guard(fn, *args): how a sink is called.

    Lifecycle: `begin()` (summary.json says running), `start(info)` once the run's scales are known
    (run.json, the sinks, the monitor), `baseline()` and `step()` as the run goes, `close()`.
    """

    def __init__(self, run_dir: Path, *, steps: int, world_size: int = 1, sinks: Sequence[StepSink] = (),
                 traces: TraceSink | None = None, health: HealthSettings | None = None, origin: dict | None = None,
                 guard: Callable | None = None):
        self.dir, self.steps, self.world_size = Path(run_dir), steps, world_size
        self.traces = traces
        self.sinks: list[StepSink] = [*sinks, *([traces] if traces else [])]  # the record joins them at start
        self.health = health or HealthSettings()
        self.origin = origin or {}
        self.record: RunRecord | None = None
        self.monitor: HealthMonitor | None = None
        self.book = Book()
        self.attempt = 1
        self.errors = 0  # telemetry failures caught (summary.json's telemetry_errors)
        self._guard = guard or self.tolerate
        self._t0 = time.monotonic()
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------

    def begin(self, step: int, attempt: int = 1, resumed: bool = False, **summary) -> None:
        """The run starts (again): summary.json says running, with this attempt (trace ids carry it: it is
        on disk before anything is traced, so a resume never re-emits an id), and events.jsonl says
        started or resumed. A failure to write raises: nothing has trained yet."""
        self.attempt = attempt
        self.reset_clock()
        self.write_summary("running", step, **summary)
        self.event("resumed" if resumed else "started", attempt=attempt, step=step, pid=os.getpid(), **self.origin)

    def start(self, info: RunInfo, resume_step: int | None = None) -> None:
        """Once the scales are known: run.json, the record (fresh, or kept through `resume_step`), every
        sink and the monitor (on a resume, it reads the steps the record kept)."""
        runfiles.write_run_info(self.dir, info)
        trace_url = self.traces.links.trace if self.traces else None
        self.record = RunRecord(self.dir, list(info.scales.reward_weights), trace_url)
        self.sinks.insert(0, self.record)
        for sink in self.sinks:
            sink.start(info)
        self.record.open(resume_step)
        h = self.health
        if h.enabled:
            self.monitor = HealthMonitor(frozenset(h.stop_on), frozenset(h.halt_on),
                                         configured(info.scales.window, info.scales.thresholds),
                                         group_size=info.scales.group_size)
            self.monitor.start(info)
            if resume_step:
                self.monitor.seed(ingest.load(self.dir / "steps.csv"))

    def reset_clock(self) -> None:
        """summary.json's seconds_this_session count from now (ours: from the end of start-up)."""
        self._t0 = time.monotonic()

    def close(self, status: str, step: int, reason: str = "", **summary) -> None:
        """Close every sink (each bounded; one's failure is counted, the others still close), then write
        the final summary and the `ended` event. Never raises: the record up to now stands."""
        if not self._closed:
            self._closed = True
            for sink in self.sinks:
                self.tolerate(sink.close)
        self.tolerate(self.write_summary, status, step, reason, **summary)
        self.tolerate(self.event, "ended", status=status, step=step, reason=reason)

    # -- the steps -----------------------------------------------------------------------------

    def baseline(self, ev: Eval, step: int = 0) -> None:
        """The evaluation before training: traced, curve row 0, and the monitor's accuracy reference."""
        base = self._traced(StepStats.partial(step, eval=ev))
        if self.traces:
            self.traces.on_step(base)
        self.record.write_baseline(base)
        if self.monitor:
            self.monitor.baseline(ev.sample_acc)
        self.book.baseline = self.book.last_eval = _accuracy(ev)
        self.book.last_eval_step = step

    def step(self, stats: StepStats) -> tuple[StepStats, Verdict | None]:
        """One record through the pipeline: the verdict stamped on it, its traces planned, the book kept,
        then every sink. Returns the record as the sinks saw it, and the verdict (None: no monitor)."""
        verdict = self.monitor.observe(stats) if self.monitor else None
        if verdict is not None:
            stats = verdict.stamp(stats)
            for c in verdict.new:
                self.book.conditions.setdefault(c.id, c.first_step)
        stats = self._traced(stats)
        self.book.invalid_rewards += stats.invalid_rewards
        if stats.eval is not None:
            self.book.last_eval, self.book.last_eval_step = _accuracy(stats.eval), stats.step
        for sink in self.sinks:
            self._guard(sink.on_step, stats)
        return stats, verdict

    def point(self) -> None:
        """A curve row now, for the steps since the last one (a trainer that does not evaluate says when)."""
        if self.record is not None:
            self._guard(self.record.point)

    def flush(self) -> None:
        """Bounded: the traces handed over so far are exported (at a checkpoint)."""
        if self.traces:
            self.traces.flush()

    def _traced(self, stats: StepStats) -> StepStats:
        return replace(stats, traces=self.traces.plan(stats)) if self.traces else stats

    # -- files ---------------------------------------------------------------------------------

    def write_summary(self, status: str, step: int, reason: str = "", **fields) -> None:
        """summary.json: the run's status and what every trainer records, and `fields` (the trainer's own).
        Merged into what is there (the daemon's submitted_at stays)."""
        b = self.book
        runfiles.update_summary(self.dir / "summary.json", **{
            "status": status, "step": step, "steps": self.steps, "attempt": self.attempt, "pid": os.getpid(),
            "reason": reason, "world_size": self.world_size, **self.origin,
            "seconds_this_session": round(time.monotonic() - self._t0, 1),
            "baseline": b.baseline, "final_eval": b.last_eval, "final_eval_step": b.last_eval_step,
            "invalid_rewards": b.invalid_rewards, "health_conditions": b.conditions,
            "telemetry_dropped": DROPS.report(),  # what metrics and traces could not deliver (also on /metrics)
            "telemetry_errors": self.errors, **fields})

    def event(self, kind: str, **fields) -> None:
        runfiles.event(self.dir / "events.jsonl", kind, **fields)

    # -- failures ------------------------------------------------------------------------------

    def tolerate(self, fn: Callable, *args, **kwargs):
        """fn(*args): a failure is logged (the first), counted, and the run goes on (None)."""
        try:
            return fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - telemetry never stops training
            self.errors += 1
            if self.errors == 1:
                log.exception("telemetry: %s failed; training goes on (failures are counted in summary.json, "
                              "telemetry_errors)", getattr(fn, "__qualname__", fn))
            return None
