"""Where one GRPO step's time goes, phase by phase, on the demo and on 32-token completions.

The step's own functions are wrapped by timers (nothing in the step is changed for this): each
phase's time is exclusive (a phase nested in another is subtracted from it), and "step, other" is
what the step does outside every named phase (advantages, loss arithmetic, masks). Sinks are the
trainer's per-step consumers (CSV record, OTel, health monitor) run after the step as the loop
does (the OTel sink records on the calling thread; at a revision that used a worker thread, the
profile waits for it).
Evaluation (held-out set, sampled + greedy, every `run.sample_every` steps) is shown amortised.

    python benchmarks/profile_step.py [--settings demo tok32] [--steps 12] [--at REV] [--threads N] [--clock cpu]

`--at REV` profiles our step as it was at git revision REV (the "before" of docs/benchmarks.md).
`--threads 1 --clock cpu` (CPU time of one thread) moves far less when others load the machine.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import common  # noqa: E402


class Phases:
    """Exclusive wall time per phase name, for one step at a time."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.now: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []  # [start, time spent in children]

    @contextmanager
    def phase(self, name: str):
        self._stack.append([self.clock(), 0.0, name])
        try:
            yield
        finally:
            start, children, _ = self._stack.pop()
            total = self.clock() - start
            self.now[name] += total - children
            if self._stack:
                self._stack[-1][1] += total

    def wrap(self, owner, attr: str, name: str, unless_in: tuple[str, ...] = ()) -> None:
        """Time owner.attr as `name`, except inside the phases `unless_in`, which keep the time."""
        fn = getattr(owner, attr)

        def timed(*a, **k):
            if self._stack and self._stack[-1][2] in unless_in:
                return fn(*a, **k)
            with self.phase(name):
                return fn(*a, **k)

        setattr(owner, attr, timed)


def instrument(ph: Phases, run: common.Ours) -> None:
    import torch

    from grpo_sentinel.service.grpo import math as gm
    from grpo_sentinel.service.grpo import step

    ph.wrap(step, "sample", "sampling")
    ph.wrap(run.scorer, "score", "reward")
    ph.wrap(step, "_reference_logprobs", "reference pass")
    ph.wrap(step, "_completion_logits", "policy forward", unless_in=("reference pass",))
    for fn in ("token_logprobs", "token_entropy"):
        ph.wrap(gm, fn, "log-probs + entropy", unless_in=("reference pass",))
    ph.wrap(torch.Tensor, "backward", "backward")
    ph.wrap(torch.nn.utils, "clip_grad_norm_", "grad clip")
    ph.wrap(run.policy.optimizer, "step", "optimizer")
    ph.wrap(run.policy.scheduler, "step", "optimizer")
    ph.wrap(step, "_stats", "statistics")


def profile(setting: str, steps: int, tmp: Path, clock) -> tuple[list[dict[str, float]], float]:
    from grpo_sentinel.service.trainer import evaluate, run_info
    from grpo_sentinel.telemetry.health.monitor import HealthMonitor
    from grpo_sentinel.telemetry.otel import OTelSink
    from grpo_sentinel.telemetry.record import RunRecord

    run = common.ours(common.model_dir(setting, tmp), common.SETTINGS[setting])
    ph = Phases(clock)
    instrument(ph, run)
    info = run_info(run.cfg, tmp, run.policy)
    (tmp / f"run-{setting}").mkdir()
    record = RunRecord(tmp / f"run-{setting}", [r.name for r in run.cfg.rewards])
    otel, monitor = OTelSink(("127.0.0.1", 0)), HealthMonitor(group_size=common.G)
    for sink in (record, otel, monitor):
        sink.start(info)
    record.open(None)
    rows = []
    for _ in range(steps):
        ph.now.clear()
        t0 = clock()
        with ph.phase("step, other"):
            stats = run.next()
        with ph.phase("sinks"):
            record.on_step(stats)
            monitor.observe(stats)
            otel.on_step(stats)
            if hasattr(otel, "flush"):  # revisions before 2026-12-03 recorded on a worker thread: wait for it
                otel.flush()
        ph.now["total"] = clock() - t0
        rows.append(dict(ph.now))
    otel.close()
    record.close()
    t0 = clock()
    evaluate(run.policy, run.data.train[:200], run.cfg)  # 200: the default data.eval_size
    eval_per_step = (clock() - t0) / run.cfg.run.sample_every
    return rows[2:], eval_per_step  # two warm-up steps


ORDER = ["sampling", "reward", "reference pass", "policy forward", "log-probs + entropy", "backward", "grad clip",
         "optimizer", "statistics", "step, other", "sinks"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--settings", nargs="+", default=list(common.SETTINGS), choices=list(common.SETTINGS))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--at", metavar="REV", help="profile the step as it was at this git revision")
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or the process's CPU time (moves less when others load the machine)")
    args = ap.parse_args()
    if args.at:  # the same script, importing grpo_sentinel from that revision
        with tempfile.TemporaryDirectory() as tmp:
            argv = [sys.executable, __file__, "--settings", *args.settings, "--steps", str(args.steps),
                    "--clock", args.clock, *(["--threads", str(args.threads)] if args.threads else [])]
            sys.exit(subprocess.run(argv, env=common.code_at(args.at, Path(tmp))).returncode)
    import torch

    from grpo_sentinel.service.grpo import step

    if args.threads:
        torch.set_num_threads(args.threads)
    print(common.machine() + f"; clock: {args.clock}")
    print(f"step: {step.__file__}")
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            rows, eval_ms = profile(setting, args.steps, Path(tmp),
                                    time.perf_counter if args.clock == "wall" else time.process_time)
            med = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in ORDER + ["total"]}
            print(f"\n{setting}: max_new_tokens={common.SETTINGS[setting]}, G={common.G}, prompts={common.PROMPTS}, "
                  f"median of {len(rows)} steps: {1e3 * med['total']:.1f} ms/step, "
                  f"{common.G * common.PROMPTS / med['total']:.0f} completions/s")
            for k in ORDER:
                print(f"  {k:<22}{1e3 * med[k]:8.1f} ms  {100 * med[k] / med['total']:5.1f} %")
            print(f"  {'(evaluation, amortised':<22}{1e3 * eval_ms:8.1f} ms  per step at sample_every=20, eval_size=200)")


if __name__ == "__main__":
    main()
