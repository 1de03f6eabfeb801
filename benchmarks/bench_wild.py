"""`diagnose` on real logs written by other people, each read as its authors describe the run.

benchmarks/wild/ holds one folder per log with a SOURCE file: where the log comes from
(repository, path, commit, licence), the authors' own words on the outcome, quoted, and the label
those words give (`expect`). The logs themselves are other people's data, fetched from public
repositories: they are not committed here (this workplace keeps fetched data only in the steering
repository's shared/); `benchmarks/fetch_wild.py` fetches them, each checked against the sha256 its
SOURCE gives. Each is looked for beside its SOURCE, then in `--logs DIR/<folder>/` (by
default shared/wild/ beside the checkout), then among the test fixtures that shared/ provided
(tests/fixtures/book-runs/); a log found nowhere, or found with another sha256, is listed as absent and
not scored.

- healthy: the authors call the run good or stable. Agreement: judged, and no critical page.
- failure: the authors document a failure; `causes` lists the health-table rows that read what
  they describe. Agreement: a warning or a critical with one of those causes.
- mixed, none: the words are ambivalent, or there are none. Reported, never scored.

Per log it prints what was read (columns mapped to ours, ignored, derived), the verdicts, and
whether they agree; then the totals: agreement, misses, critical pages on healthy runs and the
logs that could not be judged (no reward read, or fewer rows than two detector windows).
diagnose is pure Python over a few hundred rows a log: the whole corpus takes about a second.

    python benchmarks/bench_wild.py [--corpus benchmarks/wild] [--logs ../shared/wild] [--verbose] [--set NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from grpo_sentinel.telemetry.health.detectors import diagnose, unjudgeable
from grpo_sentinel.telemetry.health.ingest import IngestError, load
from grpo_sentinel.telemetry.health.thresholds import configured, detector_window, parse_settings

CORPUS = Path(__file__).parent / "wild"
REPO = Path(__file__).resolve().parents[1]
LOGS = REPO.parent / "shared" / "wild"  # where the steering repository keeps the fetched logs
FIXTURES = REPO / "tests" / "fixtures" / "book-runs"
LABELS = ("healthy", "failure", "mixed", "none")


@dataclass
class Result:
    name: str
    expect: str
    causes: tuple[str, ...]
    declared: str = ""  # a report set's declaration (SOURCE `declared`): committed before any detector read it
    absent: bool = False  # the log is not on this machine (see the module docstring)
    stale: str = ""  # a file found under the log's name whose sha256 is not SOURCE's: not scored
    refused: str = ""  # the ingester's message when it refused the log
    unjudged: str = ""  # why nothing could be judged, when so
    read: int = 0
    ignored: int = 0
    derived: int = 0
    critical: tuple[str, ...] = ()
    warning: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    @property
    def paged(self) -> tuple[str, ...]:
        return self.critical + self.warning

    @property
    def agrees(self) -> bool | None:
        """None where nothing is scored (mixed, none, or the log is absent)."""
        if self.absent:
            return None
        if self.expect == "healthy":
            return not (self.refused or self.unjudged or self.critical)
        if self.expect == "failure":
            return bool(set(self.paged) & set(self.causes))
        return None


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_log(folder: Path, name: str, logs: Path) -> Path | None:
    return next((p for p in (folder / name, logs / folder.name / name, FIXTURES / name) if p.is_file()), None)


def run_one(folder: Path, logs: Path = LOGS, changed: dict | None = None) -> Result:
    source = yaml.safe_load((folder / "SOURCE").read_text())
    expect = source["expect"]
    if expect not in LABELS:
        raise ValueError(f"{folder}/SOURCE: expect must be one of {LABELS}, got {expect!r}")
    r = Result(folder.name, expect, tuple(source.get("causes") or ()), declared=str(source.get("declared") or ""))
    path = find_log(folder, source["log"], logs)
    if path is None:
        r.absent = True
        return r
    if source.get("sha256") and sha256(path.read_bytes()) != source["sha256"]:
        r.absent, r.stale = True, str(path)  # another version of the file: the authors' words are about this one
        return r
    try:
        log = load(path)
    except IngestError as e:
        r.refused = str(e)
        return r
    th = configured(detector_window(log.window, log.completions_per_step), changed)
    diag = diagnose(log, th)
    r.read, r.ignored, r.notes = len(log.read), len(log.ignored), log.notes
    r.derived = sum(n.startswith("derived:") for n in log.notes)
    r.unjudged = unjudgeable(log, th) or ""
    r.critical = tuple(sorted({c.id for c in diag.conditions if c.severity == "critical"}))
    r.warning = tuple(sorted({c.id for c in diag.conditions if c.severity == "warning"} - set(r.critical)))
    return r


def report(results: list[Result], verbose: bool) -> dict:
    for r in results:
        verdict = {True: "agrees", False: "DISAGREES", None: "not scored"}[r.agrees]
        print(f"{r.name} [{r.expect}] {verdict}")
        if r.stale:
            print(f"  absent: {r.stale} is not the file SOURCE names (its sha256 differs): benchmarks/fetch_wild.py")
            continue
        if r.absent:
            print("  absent: its log is not on this machine: benchmarks/fetch_wild.py fetches it (SOURCE says from where)")
            continue
        if r.refused:
            print(f"  refused: {r.refused}")
            continue
        print(f"  columns: {r.read} read, {r.ignored} ignored, {r.derived} derived")
        if r.unjudged:
            print(f"  could not judge: {r.unjudged}")
        print(f"  critical: {', '.join(r.critical) or '-'}; warning: {', '.join(r.warning) or '-'}")
        if r.expect == "failure" and not r.agrees:
            print(f"  miss: the authors' failure is read by {', '.join(r.causes)}; none paged")
        if verbose:
            print("\n".join(f"  note: {n}" for n in r.notes))
    totals = tally(results)
    print(f"\ntotal: {summary(totals)}")
    return totals


def tally(results: list[Result]) -> dict:
    scored = [r for r in results if r.agrees is not None]
    present = [r for r in results if not r.absent]
    return {
        "logs": len(results),
        "absent": sum(r.absent for r in results),
        "refused": sum(bool(r.refused) for r in results),
        "could_not_judge": sum(bool(r.unjudged) for r in results if not r.refused),
        "scored": len(scored),
        "agree": sum(bool(r.agrees) for r in scored),
        "healthy": sum(r.expect == "healthy" for r in present),
        "critical_on_healthy": sum(bool(r.critical) for r in present if r.expect == "healthy"),
        "failures": sum(r.expect == "failure" for r in present),
        "missed_failures": sum(not r.agrees for r in present if r.expect == "failure"),
    }


def summary(t: dict) -> str:
    return (f"{t['logs']} logs ({t['absent']} absent), {t['refused']} refused, {t['could_not_judge']} could not be judged; "
            f"agreement {t['agree']}/{t['scored']} scored; critical pages on healthy runs {t['critical_on_healthy']}/"
            f"{t['healthy']}; failures missed {t['missed_failures']}/{t['failures']}")


def evaluate(corpus: Path = CORPUS, logs: Path = LOGS, changed: dict | None = None) -> list[Result]:
    """Every log of the corpus, diagnosed with the default thresholds and `changed` (--set)."""
    folders = sorted(p for p in corpus.iterdir() if (p / "SOURCE").is_file())
    return [run_one(p, logs, changed) for p in folders]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=CORPUS, help="the folders of SOURCE files")
    ap.add_argument("--logs", type=Path, default=LOGS, help="where the fetched logs lie, one folder each")
    ap.add_argument("--verbose", action="store_true", help="print every ingest note")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a threshold other than its default (telemetry/health/thresholds.py), as health.thresholds sets it")
    args = ap.parse_args()
    try:
        changed = parse_settings(args.set)
    except ValueError as e:
        ap.error(str(e))
    t0 = time.perf_counter()
    results = evaluate(args.corpus, args.logs, changed)
    elapsed = time.perf_counter() - t0
    report(results, args.verbose)
    print(f"{elapsed:.2f} s for {len(results)} logs ({platform.python_implementation()} {platform.python_version()}, "
          f"{platform.machine()})")


if __name__ == "__main__":
    main()
