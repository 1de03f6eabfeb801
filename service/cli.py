"""`grpo-sentinel` command line."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from datetime import datetime
from pathlib import Path

from grpo_sentinel.service.config import ConfigError, load_config
from grpo_sentinel.telemetry.health import commands as health_cli
from grpo_sentinel.telemetry.schema import RunInfo, StepStats

log = logging.getLogger("grpo_sentinel")

EXIT_BAD_INPUT = 2


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grpo-sentinel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run GRPO (with no config: the embedded demo, 300 steps)")
    train.add_argument("--config", type=Path, help="YAML config (see examples/)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. --set grpo.beta=0.02 (repeatable)")
    train.add_argument("--steps", type=int, help="number of optimizer steps (run.steps)")
    train.add_argument("--out", help="parent folder of run directories (run.out_dir)")
    train.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest complete checkpoint")
    diag = sub.add_parser("diagnose", help="read a run log against the health table")
    diag.add_argument("path", type=Path, help="steps.csv, reward-vs-step.csv, a run directory, a book CSV, a TRL "
                                              "trainer_state.json or a verl/OpenRLHF JSONL metrics log")
    diag.add_argument("--format", default="auto", choices=health_cli.FORMATS)
    diag.add_argument("--json", action="store_true", help="print {conditions, lead, summary, not_assessable, notes} as JSON, nothing else")
    diag.add_argument("--report", type=Path, metavar="FILE.md", help="write the markdown monitoring report")
    diag.add_argument("--plot", type=Path, metavar="FILE.png", help="write a PNG of the curves with condition windows shaded")
    diag.add_argument("--window", type=health_cli.whole_number(2, "detector window in steps"),
                      help="detector window in steps (default: the run's health.window, else "
                           "~400 completions when the log says G and prompts per step, as the "
                           "trainer does; else 20)")
    diag.add_argument("--max-new-tokens", type=health_cli.whole_number(1, "the completion cap"),
                      help="completion cap, if the log does not say (for length_pathology)")
    diag.add_argument("--vocab-size", type=health_cli.whole_number(2, "V, the entropy ceiling is ln V"),
                      help="V, if the log does not say (entropy ceiling ln V)")
    diag.add_argument("--eval-n", type=health_cli.whole_number(1, "held-out set size"),
                      help="held-out set size, if the log does not say (accuracy noise)")
    rules = sub.add_parser("rules", help="print the Prometheus alert rules (deploy/prometheus/grpo-rules.yml) with "
                                         "your windows and thresholds")
    rules.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                       help="window=5m (the detectors' window in time: ~20 of your steps), pending=2m (for:), stall=15m, "
                            "max_reward=1, runbook=URL, grafana=URL (alerts link the run's dashboard), "
                            "group_by=job,instance,run_id (the labels every rule aggregates by), or any "
                            "detector threshold, e.g. kl_bound=0.5 (repeatable; each is checked against its domain)")
    args = parser.parse_args(argv)
    if args.command == "diagnose":
        return _diagnose(args)
    if args.command == "rules":
        return _rules(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are local directories; never reach for a hub
    return _train(args)


def telemetry_sinks(cfg) -> list:
    from grpo_sentinel.telemetry.otel import OTelSink, otlp_exporter_from_env

    t = cfg.telemetry
    otlp = otlp_exporter_from_env()
    if not t.prometheus and otlp is None:
        return []
    addr = (t.prometheus_host, t.prometheus_port) if t.prometheus else None
    return [OTelSink(addr, otlp, t.otlp_export_interval_s, t.linger_s)]


def _diagnose(args) -> int:
    return health_cli.diagnose_command(args)


def _rules(args) -> int:
    return health_cli.rules_command(args.settings)


def _train(args) -> int:
    from grpo_sentinel.service.trainer import Trainer  # heavy imports after argument parsing: --help stays instant

    try:
        if args.resume is not None:
            saved = args.resume / "config.yaml"
            if not saved.is_file():
                raise ConfigError(f"--resume {args.resume}: no config.yaml there; is it a run directory?")
            if args.config is not None:
                raise ConfigError("--resume uses the run's saved config.yaml; drop --config (use --set to change a field)")
            cfg = load_config(saved, args.overrides, **{"run.steps": args.steps})
            run_dir = args.resume
        else:
            cfg = load_config(args.config, args.overrides, **{"run.steps": args.steps, "run.out_dir": args.out})
            run_id = cfg.run.run_id or f"{datetime.now():%Y%m%d-%H%M%S}-seed{cfg.run.seed}"
            run_dir = Path(cfg.run.out_dir) / run_id
            if (run_dir / "config.yaml").exists():
                raise ConfigError(f"run directory {run_dir} already exists: pick another run.run_id, or --resume it")
        trainer = Trainer(cfg, run_dir, sinks=[Progress(cfg.run.steps), *telemetry_sinks(cfg)])
    except (ConfigError, ValueError, OSError) as e:
        print(f"grpo-sentinel: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = trainer.run()
    print(f"run {result.status} at step {result.step}: {result.run_dir}")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
