"""The progress line `train` prints, and `runs follow` prints the same from the daemon's stream."""

from __future__ import annotations

import logging
import math
import sys
import time

from grpo_sentinel.telemetry.schema import RunInfo, StepStats

log = logging.getLogger("grpo_sentinel")


class Progress:
    """A StepSink: a live status line on a terminal, one plain log line per step otherwise."""

    def __init__(self, total: int, stream=sys.stderr):
        self.total, self.stream = total, stream
        self.tty = stream.isatty()
        self.t0 = time.monotonic()

    def start(self, info: RunInfo) -> None:
        log.info("run %s: %s, loss %s, %d steps", info.run_id, info.model, info.loss_type, self.total)

    def on_step(self, s: StepStats) -> None:
        kl = "-" if math.isnan(s.kl) else f"{s.kl:.4f}"
        line = (f"step {s.step}/{self.total} reward {s.reward:.3f} kl {kl} loss {s.loss:+.4f} "
                f"entropy {s.entropy:.3f} zero-signal {s.frac_zero_std:.2f} {s.step_time:.2f}s/step")
        if s.skipped:
            line += f" SKIPPED ({s.skipped})"
        if s.eval is not None:
            line += f" | sample_acc {s.eval.sample_acc:.3f} greedy {s.eval.greedy_acc:.3f} (n={s.eval.n})"
        if self.tty:
            eta = (time.monotonic() - self.t0) / max(s.step, 1) * (self.total - s.step)
            end = "\n" if s.eval is not None or s.step == self.total else ""
            self.stream.write(f"\r\033[K{line} eta {eta:.0f}s{end}")
            self.stream.flush()
        else:
            log.info("%s", line)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
