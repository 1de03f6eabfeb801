"""`grpo-sentinel diagnose` and `grpo-sentinel rules`: argument checks and the commands themselves.

service/cli.py only declares the arguments; what they mean and every error lives here. A bad
input or argument exits 2 with one line on stderr naming the file or field and what to do, never
a traceback, and nothing is written that was not asked for: every output path is checked before
anything is read or written. This module imports nothing heavy, so `--help` stays instant.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EXIT_BAD_INPUT = 2
FORMATS = ["auto", "sentinel", "book", "csv", "trl", "verl", "openrlhf", "jsonl", "stdout", "notebook"]


def whole_number(minimum: int, what: str):
    """argparse type: a whole number >= minimum (argparse then exits 2 with the message)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({what})") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum} ({what}), got {value}")
        return value
    return parse


def _fail(message: str) -> int:
    print(f"grpo-sentinel diagnose: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _output(path: Path | None, flag: str, suffix: str) -> str | None:
    """Why `path` cannot be written as the output of `flag`, or None."""
    if path is None:
        return None
    if path.is_dir():
        return f"{flag} {path}: is a directory; give a file name, e.g. {path / ('run' + suffix)}"
    if path.suffix.lower() != suffix:
        return f"{flag} {path}: give a {suffix} file name (e.g. {path.with_suffix(suffix)})"
    if not path.parent.is_dir():
        return f"{flag} {path}: the directory {path.parent} does not exist; create it first"
    return None


def reading(step_column: str | None, maps: list[str]):
    """--step-column and --map (OURS=THEIRS, or a YAML file of `ours: theirs` lines) as ingest.Reading;
    ValueError saying what to write."""
    from grpo_sentinel.telemetry.health.ingest import Reading

    names: dict[str, str] = {}
    for item in maps:
        ours, eq, theirs = item.partition("=")
        if eq:
            pairs = {ours.strip(): theirs.strip()}
        else:
            pairs = _map_file(Path(item))
        for k, v in pairs.items():
            if not k or not v:
                raise ValueError(f"--map {item!r}: write OURS=THEIRS, e.g. --map reward=env/all/reward/total")
            names[k] = v
    return Reading(step_column, names)


def _map_file(path: Path) -> dict[str, str]:
    import yaml

    if not path.is_file():
        raise ValueError(f"--map {path}: neither OURS=THEIRS nor a YAML file (e.g. --map reward=env/all/reward/total)")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ValueError(f"--map {path}: not a readable YAML file ({e})") from None
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise ValueError(f"--map {path}: the file must hold `ours: theirs` lines, e.g. `reward: env/all/reward/total`")
    return {k.strip(): v.strip() for k, v in raw.items()}


def diagnose_command(args) -> int:
    import json
    import math

    problem = _output(args.report, "--report", ".md") or _output(args.plot, "--plot", ".png")
    if problem:
        return _fail(problem)
    try:
        how = reading(args.step_column, args.map)
    except ValueError as e:
        return _fail(str(e))
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (checked before anything is written)
        except ImportError:
            return _fail("--plot needs matplotlib: .venv/bin/pip install -e '.[plot]'")

    from grpo_sentinel.telemetry.health.detectors import diagnose
    from grpo_sentinel.telemetry.health.ingest import IngestError, load
    from grpo_sentinel.telemetry.health.report import plot, to_json, to_markdown, to_text, with_generations
    from grpo_sentinel.telemetry.health.thresholds import configured, detector_window

    try:
        log = load(args.path, args.format, how)
    except IngestError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"{args.path}: cannot read ({e.strerror or e})")
    except RecursionError:
        return _fail(f"{args.path}: nested too deeply to be a run log")
    log.max_new_tokens = args.max_new_tokens or log.max_new_tokens
    log.ln_vocab = math.log(args.vocab_size) if args.vocab_size else log.ln_vocab
    log.eval_n = args.eval_n or log.eval_n
    th = configured(detector_window(args.window or log.window, log.completions_per_step), log.thresholds)
    result = with_generations(diagnose(log, th), log)
    if args.plot:
        try:
            plot(result, log, th, args.plot)
        except (RuntimeError, OSError) as e:
            return _fail(f"--plot {args.plot}: {e}")
    if args.report:
        try:
            args.report.write_text(to_markdown(result, log, th))
        except OSError as e:
            return _fail(f"--report {args.report}: cannot write ({e.strerror or e})")
    print(json.dumps(to_json(result, log, th), indent=1, allow_nan=False) if args.json
          else to_text(result, log, th))
    return 0


def rules_command(settings: list[str], fmt: str = "prometheus") -> int:
    """Print the rules as Prometheus rules or as Grafana-managed rules (the same rules: rules_grafana.py)."""
    from grpo_sentinel.telemetry.health import rules_grafana
    from grpo_sentinel.telemetry.health.rules import RuleParams, render, with_settings

    try:
        grafana, rest = rules_grafana.with_grafana_settings(settings)
        if fmt != "grafana" and rest != settings:
            raise ValueError(f"{', '.join(s for s in settings if s not in rest)}: Grafana's settings need --format grafana")
        params = with_settings(RuleParams(), rest)
    except ValueError as e:
        more = ("; with --format grafana also " + ", ".join(rules_grafana.GRAFANA_SETTINGS)
                if "unknown rule setting" in str(e) else "")
        print(f"grpo-sentinel rules: {e}{more}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if fmt == "grafana":
        try:
            text = rules_grafana.render(params, grafana)
        except ImportError:
            print("grpo-sentinel rules: --format grafana needs grafana-foundation-sdk: pip install 'grpo-sentinel[dashboards]'",
                  file=sys.stderr)
            return EXIT_BAD_INPUT
        except ValueError as e:
            print(f"grpo-sentinel rules: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(text, end="")
        return 0
    print(render(params), end="")
    return 0
