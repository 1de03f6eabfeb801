"""grpo-sentinel: GRPO post-training (LoRA) that watches its own health: metrics, alerts, diagnosis, traces."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
from pathlib import Path

from grpo_sentinel.service.config import ConfigError, load_config
from grpo_sentinel.service.progress import Progress
from grpo_sentinel.telemetry.health import commands as health_cli

log = logging.getLogger("grpo_sentinel")

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    """Every command and flag (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="grpo-sentinel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run GRPO (with no config: the embedded demo, 300 steps)")
    train.add_argument("--config", type=Path, help="YAML config (see examples/)")
    train.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config field, e.g. --set grpo.beta=0.02 (repeatable)")
    train.add_argument("--steps", type=int, help="number of optimizer steps (run.steps)")
    train.add_argument("--out", help="parent folder of run directories (run.out_dir)")
    train.add_argument(
        "--resume", type=Path, metavar="RUN_DIR", help="continue the run in RUN_DIR from its newest complete checkpoint"
    )
    diag = sub.add_parser("diagnose", help="read a run log against the health table")
    diag.add_argument("path", type=Path, help="any per-step metrics log: our run directory or steps.csv, a JSONL or CSV "
                                              "metrics log (verl, OpenRLHF, Tinker, prime-rl, your own loop), a W&B "
                                              "history export, a TRL trainer_state.json or output_dir, a console log")
    diag.add_argument("--format", default="auto", choices=health_cli.FORMATS)
    diag.add_argument("--step-column", metavar="NAME", help="the log's step column, if it is not one of step, "
                                                             "global_step, _step, grpo_step, train_step, iteration, ...")
    diag.add_argument("--map", action="append", default=[], metavar="OURS=THEIRS",
                      help="read the log's column THEIRS as our OURS, e.g. --map reward=env/all/reward/total "
                           "(repeatable), or a YAML file of `ours: theirs` lines")
    diag.add_argument(
        "--json",
        action="store_true",
        help="print {conditions, lead, summary, not_assessable, notes} as JSON, nothing else",
    )
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
                            "langfuse=URL of the Langfuse project (alerts link the run's generations), "
                            "group_by=job,instance,run_id (the labels every rule aggregates by), or any "
                            "detector threshold, e.g. kl_bound=0.5 (repeatable; each is checked against its domain)")
    rules.add_argument("--format", choices=["prometheus", "grafana"], default="prometheus",
                       help="prometheus: a Prometheus rule file; grafana: the same rules as Grafana-managed alert rules "
                            "(file provisioning), with datasource=UID, folder=, interval=1m, org=1, uid_prefix=grpo settable")
    dashboard = sub.add_parser("dashboard", help="print a Grafana dashboard (grafana/dashboards/) for your monitoring "
                                                 "config")
    dashboard.add_argument("name", nargs="?", choices=["health", "service"], default="health",
                           help="health: one run (grpo-health.json, default); service: the daemon's runs (grpo-service.json)")
    dashboard.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE",
                           help="the monitoring config the rules read too: window=5m (the moving means' default), "
                                "selector='namespace=\"ml\"' (label matchers every query adds) (repeatable)")
    generate = sub.add_parser("generate", help="write every generated file of a checkout (rules, Helm rules template, "
                                               "Grafana rules, dashboards, runbook, metrics doc, OpenAPI document)")
    generate.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each file that differs "
                                                               "from its generator")
    generate.add_argument("--root", type=Path, help="the checkout (default: the one this package runs from)")
    serve = sub.add_parser("serve", help="run the trainer daemon: an HTTP API and a restart-safe queue of runs")
    serve.add_argument("--config", type=Path, help="daemon settings (YAML: listen, state_dir, grace_s, run_at_start, "
                                                        "reward_modules, allowed_paths, limits)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="API address (default 127.0.0.1:8000; beyond loopback "
                                                             "GRPO_SENTINEL_API_TOKEN is required)")
    serve.add_argument("--state-dir", type=Path, help="queue and run directories (default ./grpo-state)")
    serve.add_argument("--grace-s", type=float, help="seconds from SIGTERM to exit (default 30)")
    serve.add_argument("--run-at-start", type=Path, metavar="FILE", help="a run config queued at the first start")
    serve.add_argument("--reward-module", dest="reward_modules", action="append", metavar="MODULE",
                       help="a module (with its submodules) whose functions submitted runs may use as rewards "
                            "(repeatable; default: the built-ins only)")
    serve.add_argument("--limit", dest="limits", action="append", metavar="NAME=N",
                       help="raise or lower a bound on submitted runs, e.g. --limit group_size=512 (repeatable; "
                            "names: group_size, prompts_per_step, max_new_tokens, lora_r, nproc_per_node, "
                            "reward_workers, eval_size, body_bytes)")
    serve.add_argument("--allow-path", dest="allowed_paths", action="append", type=Path, metavar="DIR",
                       help="a directory submitted model and data paths may lie under (repeatable; default: the "
                            "directory the daemon starts in)")
    _runs_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _command(build_parser().parse_args(argv))
    except BrokenPipeError:  # `grpo-sentinel runs show ID | head`: the reader had what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit must not fail
        return 0


def _command(args) -> int:
    if args.command == "serve":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
        from grpo_sentinel.service.daemon.serve import serve as run_daemon

        return run_daemon(args)
    if args.command == "runs":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
        from grpo_sentinel.service import client

        return client.run(args)
    if args.command == "diagnose":
        return _diagnose(args)
    if args.command == "rules":
        return _rules(args)
    if args.command == "dashboard":
        return _dashboard(args)
    if args.command == "generate":
        return _generate(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are local directories; never reach for a hub
    from grpo_sentinel.service.runs import Interrupted

    try:
        return _train(args)
    except Interrupted as e:  # a signal in the last moments, after the run's summary was written
        print(f"grpo-sentinel: {e}", file=sys.stderr)
        return 75


def _runs_parser(sub) -> None:
    """`grpo-sentinel runs ...`: a daemon's runs from the command line (service/client.py)."""
    from grpo_sentinel.service.client import DEFAULT_URL, URL_ENV

    runs = sub.add_parser("runs", help="submit, follow and stop runs on a daemon (grpo-sentinel serve); its token "
                                       "from GRPO_SENTINEL_API_TOKEN")
    cmd = runs.add_subparsers(dest="runs_command", required=True)
    daemon = argparse.ArgumentParser(add_help=False)
    daemon.add_argument("--url", help=f"the daemon's address (default ${URL_ENV}, else {DEFAULT_URL})")
    retry = argparse.ArgumentParser(add_help=False, parents=[daemon])
    retry.add_argument("--retry-s", type=health_cli.whole_number(0, "seconds"), default=120, metavar="S",
                       help="while following, how long to wait for a daemon that went away (restarting) (default 120)")
    submit = cmd.add_parser("submit", parents=[retry], help="queue a run: a config file as `train --config` reads it")
    submit.add_argument("config", type=Path, nargs="?", help="YAML config (see examples/); none: the demo")
    submit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set grpo.beta=0.02 (repeatable)")
    submit.add_argument("--follow", action="store_true", help="then follow it as `runs follow` does")
    for name, what in (("list", "every run: id, status, step"), ("show", "a run's status, metrics, conditions, accuracy")):
        p = cmd.add_parser(name, parents=[daemon], help=what)
        if name == "show":
            p.add_argument("run_id", metavar="ID")
        p.add_argument("--output", choices=("table", "json"), default="table", help="json: the API's answer, for scripts")
    follow = cmd.add_parser("follow", parents=[retry], help="print a run's progress as `train` does, until it ends; "
                                                            "exit with the run's code (0 completed, 3 halted, 75 stopped)")
    follow.add_argument("run_id", metavar="ID")
    cmd.add_parser("stop", parents=[daemon], help="stop a run: the running one checkpoints and ends `stopped`; a queued one is "
                                "removed").add_argument("run_id", metavar="ID")
    cmd.add_parser("resume", parents=[daemon], help="queue a failed run again (say, once its full disk has room): it "
                                                    "continues from its newest checkpoint").add_argument("run_id", metavar="ID")
    rec = cmd.add_parser("record", parents=[daemon], help="print a run's record as CSV")
    rec.add_argument("run_id", metavar="ID")
    rec.add_argument("--file", choices=("steps", "reward-vs-step"), default="steps",
                     help="steps.csv (every step, default) or reward-vs-step.csv (the sampling rows)")
    cmd.add_parser("report", parents=[daemon], help="print the diagnose markdown report of a run so far").add_argument(
        "run_id", metavar="ID"
    )


def telemetry_sinks(cfg) -> list:
    from grpo_sentinel.telemetry.otel import OTelSink, otlp_exporter_from_env

    t = cfg.telemetry
    try:
        otlp = otlp_exporter_from_env()
    except ValueError as e:  # an OTEL_* variable it cannot use: bad input, before the model loads
        raise ConfigError(str(e)) from None
    if not t.prometheus and otlp is None:
        return []
    addr = (t.prometheus_host, t.prometheus_port) if t.prometheus else None
    return [OTelSink(addr, otlp, t.otlp_export_interval_s, t.linger_s)]


def _diagnose(args) -> int:
    return health_cli.diagnose_command(args)


def _rules(args) -> int:
    return health_cli.rules_command(args.settings, args.format)


def _dashboard(args) -> int:
    try:
        from grpo_sentinel.telemetry import dashboard
    except ImportError:
        print("grpo-sentinel dashboard: needs grafana-foundation-sdk: pip install 'grpo-sentinel[dashboards]'",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    return dashboard.command(args.name, args.settings)


def _generate(args) -> int:
    """telemetry/generated.py's files and the service's: the daemon's OpenAPI document, the reference pages."""
    from grpo_sentinel.service import reference
    from grpo_sentinel.telemetry import generated

    try:
        files = generated.telemetry_files()
    except ImportError as e:  # the dashboards' SDK: a checkout installs it with the test extra
        print(f"grpo-sentinel generate: {e.name} is missing: pip install -e '.[test]'", file=sys.stderr)
        return EXIT_BAD_INPUT
    return generated.main(files + reference.service_files(build_parser), args.check, args.root)


class Signals:
    """SIGTERM / SIGINT for a training process. Outside the training loop (start-up, model loading,
    shutdown) a signal interrupts at once; inside it, the first asks the trainer to checkpoint at the
    step boundary, and a second interrupts at once. Either way: exit 75, a one-line message, a summary."""

    def __init__(self) -> None:
        self.trainer = None  # set while the training loop runs
        self.received: list[str] = []
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self)

    def __call__(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        if self.trainer is None or len(self.received) > 1:
            self.check()
        log.warning("received %s: finishing the current step (send it again to stop at once)", name)
        self.trainer.request_stop(name)

    def finished(self) -> None:
        """The run's final summary is written: a signal now (a daemon's rolling update in the second the
        process takes to exit) must not turn a finished run into an interrupted one, trained again."""
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)

    def check(self) -> None:
        """Interrupt if a signal came outside the loop. Called again at the points where loading ends:
        the handler's exception may land inside a library's bare `except:` (an import fallback) and be lost."""
        from grpo_sentinel.service.runs import Interrupted

        if self.received and (self.trainer is None or len(self.received) > 1):
            raise Interrupted(("a second " if len(self.received) > 1 else "") + f"{self.received[-1]}: stopped at once")


def _train(args) -> int:
    signals = Signals()  # first: a signal while anything loads must still end in a message and a summary
    from grpo_sentinel.service.config import SetupError
    from grpo_sentinel.service.data import DataError
    from grpo_sentinel.service.runs import EXIT_DISK, FINISHED, Interrupted, RunDir, RunDirError

    # Under torchrun every rank runs this; rank 0 alone speaks, takes the run directory and reports.
    main = os.environ.get("RANK", "0") == "0"
    if not main:
        logging.getLogger().setLevel(logging.WARNING)
    run = dist = None
    try:
        try:
            if args.resume is not None:
                if args.config is not None:
                    raise ConfigError("--resume uses the run's saved config.yaml; drop --config (use --set to change a field)")
                cfg = RunDir.resume_config(args.resume, args.overrides, args.steps)  # read-only, on every rank
            else:
                cfg = load_config(args.config, args.overrides, **{"run.steps": args.steps, "run.out_dir": args.out})
            from grpo_sentinel.service.launch import check_launch

            check_launch(cfg)  # model, data and rewards are there: before the run directory and the weights
            from grpo_sentinel.service.config import check_world_size
            from grpo_sentinel.service.distributed import from_env

            dist = from_env(cfg.model.device, cfg.distributed.timeout_s)
            check_world_size(cfg.grpo.prompts_per_step, dist.world)
            run = _on_rank0(dist, lambda: _take_run(args, cfg))
            from grpo_sentinel.service.trainer import Trainer  # torch: only once the config is known to be good
            from grpo_sentinel.telemetry.traces import trace_sink

            signals.check()
            metrics = telemetry_sinks(cfg) if dist.main else []
            trainer = Trainer(cfg, run, sinks=[Progress(cfg.run.steps), *metrics] if dist.main else [],
                              traces=trace_sink(cfg.traces) if dist.main else None, dist=dist)
            if not trainer.open():
                if dist.main:
                    print(f"run completed at step {trainer.state.step}: {run.path} (nothing to do)")
                return 0
            if metrics and metrics[0].prometheus_port:  # where a supervisor (the daemon) finds this run's metrics
                run.update_summary(metrics_port=metrics[0].prometheus_port)
            signals.check()
        except (ConfigError, DataError, RunDirError, SetupError, OSError) as e:
            full = isinstance(e, OSError) and e.errno == errno.ENOSPC  # not bad input: free space, run again
            if main:
                print(f"grpo-sentinel: {e}" + (": free space, then run the same command again" if full else ""),
                      file=sys.stderr)
            if run is not None and (dist is None or dist.main):
                run.discard()  # a failed start leaves no half-made run directory behind
            return EXIT_DISK if full else EXIT_BAD_INPUT
        signals.trainer = trainer
        result = trainer.loop()
        signals.finished()
    except Interrupted as e:
        if main and (run is None or run.discard()):
            print(f"grpo-sentinel: {e} before training began; nothing was kept (run the same command again)", file=sys.stderr)
        elif main:
            marked = run.stop_marked  # a stop through the daemon's API is for good
            status, reason = ("stopped", marked) if marked else ("preempted", str(e))
            summary = run.read_summary()
            if summary.get("status") not in FINISHED:  # the loop, if it ran, wrote its own summary first
                run.update_summary(status=status, reason=reason)
                run.event("ended", status=status, step=summary.get("step", 0), reason=reason)
            print(f"grpo-sentinel: {e}" + (f"; resume with --resume {run.path}" if status == "preempted" else ""),
                  file=sys.stderr)
        return 75
    finally:
        signals.trainer = None
        if dist is not None:
            dist.close()
    if not main:
        return result.exit_code
    if result.reason:
        print(f"grpo-sentinel: {result.reason}", file=sys.stderr)
    _learned(run, result)
    print(f"run {result.status} at step {result.step}: {result.run_dir}")  # last, for scripts: `tail -1`
    return result.exit_code


def _learned(run, result) -> None:
    """What the run learned (held-out accuracy from its step-0 baseline), and what to look at next."""
    summary = run.read_summary()
    base, last = summary.get("baseline"), summary.get("final_eval")
    if base and last and summary.get("final_eval_step"):  # evaluated after step 0: something to compare
        print(f"held-out accuracy (n={last['n']}): {base['sample_acc']:.3f} at step 0 -> {last['sample_acc']:.3f} at step "
              f"{summary.get('final_eval_step')} sampled at the training temperature; greedy {base['greedy_acc']:.3f} -> "
              f"{last['greedy_acc']:.3f}")
    if result.status in ("completed", "stopped_early", "halted"):
        print(f"next: grpo-sentinel diagnose {result.run_dir} --plot run.png   (the health verdicts and the curves)\n"
              "      grpo-sentinel serve   (the daemon: then grpo-sentinel runs submit --follow)")


def _take_run(args, cfg):
    """Rank 0: the new run's directory, made and locked, or the run to resume, checked and locked."""
    from grpo_sentinel.service.runs import RunDir
    from grpo_sentinel.telemetry import runfiles

    if args.resume is not None:
        return RunDir.resume(args.resume, args.overrides, args.steps)[0]
    out = Path(cfg.run.out_dir)
    return RunDir.new(out, cfg.run.run_id or runfiles.new_run_id(out, cfg.run.seed), cfg)


def _on_rank0(dist, take):
    """`take()` on rank 0; the run directory it names (or the bad-input error it raised) on every rank."""
    from grpo_sentinel.service.runs import RunDir

    run = error = None
    if dist.main:
        try:
            run = take()
        except ValueError as e:  # ConfigError, RunDirError: bad input, reported by every rank's exit code
            error = e
    path, error = dist.broadcast((run.path if run else None, error))
    if error is not None:
        raise error
    return run if dist.main else RunDir(path)


if __name__ == "__main__":
    sys.exit(main())
