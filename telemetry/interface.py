"""What the trainer calls. A sink consumes the per-step record; the trainer never knows which
backends (CSV, OpenTelemetry, health monitor, progress display) are attached.
"""

from __future__ import annotations

from typing import Protocol

from grpo_sentinel.telemetry.schema import RunInfo, StepStats


class StepSink(Protocol):
    def start(self, info: RunInfo) -> None: ...

    def on_step(self, stats: StepStats) -> None: ...

    def close(self) -> None: ...
