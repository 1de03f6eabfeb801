"""What the trainer calls. A sink consumes the per-step record; the trainer never knows which
backends (CSV, OpenTelemetry, health monitor, progress display) are attached. `annotate` and
`record_baseline` are what any trainer (ours, or TRL through its callback) does with a record before
the sinks see it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from grpo_sentinel.telemetry.schema import RunInfo, StepStats

if TYPE_CHECKING:
    from grpo_sentinel.telemetry.health.monitor import HealthMonitor, Verdict
    from grpo_sentinel.telemetry.record import RunRecord
    from grpo_sentinel.telemetry.traces import TraceSink


class StepSink(Protocol):
    def start(self, info: RunInfo) -> None: ...

    def on_step(self, stats: StepStats) -> None: ...

    def close(self) -> None: ...


def annotate(stats: StepStats, monitor: HealthMonitor | None = None,
             traces: TraceSink | None = None) -> tuple[StepStats, Verdict | None]:
    """A step's record as every sink then sees it: the health verdict stamped on it, then the
    generations to trace (the verdict's conditions choose some of them)."""
    verdict = monitor.observe(stats) if monitor else None
    if verdict is not None:
        stats = verdict.stamp(stats)
    if traces:
        stats = replace(stats, traces=traces.plan(stats))
    return stats, verdict


def record_baseline(base: StepStats, record: RunRecord, monitor: HealthMonitor | None = None,
                    traces: TraceSink | None = None) -> None:
    """The step-0 evaluation: traced, written to the record, and the monitor's accuracy baseline."""
    base, _ = annotate(base, None, traces)
    if traces:
        traces.on_step(base)
    record.write_baseline(base)
    if monitor:
        monitor.baseline(base.eval.sample_acc)
