"""Lead time, the headline quality figure: how many steps before the damage a run is paged, and how
many false pages a healthy run gets.

Damage, as a user sees it: the first evaluation point where held-out accuracy sits 10 % (relative)
below its running peak (health/lead.py damage_step). Lead = damage step - first critical verdict
(positive: paged before the damage); the warning lead likewise for the first warning. Three sources:

- fixtures: the two real book runs (tests/fixtures/book-runs, MATH-500, n = 500);
- zoo: the simulated pathologies of tests/zoo.py over many seeds, with their known onset and damage
  (the noise-free accuracy's), and 300 healthy runs of each healthy family for the false-page rate,
  printed separately for the fit set (the families and seeds the detectors were designed and
  checked on: zoo.FIT_HEALTHY, seeds 0-299; pathology seeds 0-19), the seen report set
  (zoo.REPORT_HEALTHY, seeds 1000-1299; pathology seeds 1000-1019: reported on, then seen failing and
  changed after), report set 2 (zoo.REPORT2_HEALTHY, seeds 2000-2299; pathology seeds 2000-2019:
  declared before any detector ran on them, then seen and fitted on in the third pass) and report set 3
  (zoo.REPORT3_SLOW, new shapes of the slow pathologies, seeds 3000-3019; zoo.REPORT3_HEALTHY, seeds
  3000-3299: committed before any detector ran on them, measured once, then seen and fitted on in the
  fourth pass), report set 4 (zoo.REPORT4_SLOW, seeds 4000-4019; zoo.REPORT4_HEALTHY, seeds
  4000-4299: committed before any detector ran on them, measured once, then seen and fitted on in the
  fifth pass), report set 5 (zoo.REPORT5_SLOW, seeds 5000-5019; zoo.REPORT5_HEALTHY, seeds 5000-5299:
  committed before any detector ran on them, measured once, then seen: the KL forecast's ratio came from
  it), report set 6 (zoo.REPORT6_SLOW, seeds 6000-6019; zoo.REPORT6_HEALTHY, seeds 6000-6299: declared
  after set 5's measurement, before the change it led to) and report set 7 (zoo.REPORT7_HEALTHY, seeds
  7000-7299, healthy only: declared before kl_only_learning's median test) and report set 8 (zoo.REPORT8_SLOW,
  seeds 8000-8019; zoo.REPORT8_HEALTHY, seeds 8000-8299: declared before kl_acceleration's growth test was
  changed, measured once after) and report set 9 (zoo.REPORT9_SLOW, seeds 9000-9019; zoo.REPORT9_HEALTHY, seeds
  9000-9299: declared after set 8's measurement, before the change it led to) and report set 10 (zoo.REPORT10_SLOW,
  seeds 10000-10019; zoo.REPORT10_HEALTHY, seeds 10000-10299: declared after set 9's measurement, before the seventh
  pass changed anything) and report set 11 (zoo.REPORT11_SLOW, seeds 11000-11019; zoo.REPORT11_HEALTHY, seeds
  11000-11299: declared after set 10's measurement, before the change it led to) and report set 12
  (zoo.REPORT12_SLOW, seeds 12000-12019; zoo.REPORT12_HEALTHY, seeds 12000-12299: declared after set 11's
  measurement, before the KL forecast was changed) and report set 13 (zoo.REPORT13_SLOW, seeds 13000-13019;
  zoo.REPORT13_HEALTHY, seeds 13000-13299: lengths; declared before length_drift was changed) and report set 14
  (zoo.REPORT14_SLOW, seeds 14000-14019; zoo.REPORT14_HEALTHY, seeds 14000-14299: lengths; declared after set 13's
  measurement, before length_drift's held stage was changed) and report set 15 (zoo.REPORT15_SLOW, seeds
  15000-15019; zoo.REPORT15_HEALTHY, seeds 15000-15299: lengths; declared after set 14's measurement, before
  length_drift's warning was changed) and report set 16 (zoo.REPORT16_SLOW, seeds 16000-16019; zoo.REPORT16_HEALTHY,
  seeds 16000-16299: lengths; declared after set 15's measurement, before the length forecast was changed) and report
  set 17 (zoo.REPORT17_SLOW, seeds 17000-17019; zoo.REPORT17_HEALTHY, seeds 17000-17299: lengths and KL; declared after
  the horizon's frontier was measured on sets 1-16, before the default horizon changed). Each slow
  row
  also prints
  `oracle`: the lead a test knowing the onset and the mean path could reach at the detectors' false-alarm
  rate (oracle_step);
- induced: real training of the tiny demo model with a slow pathology induced (a rising LR, a
  decaying beta, a gameable length reward, a drifting sampling temperature, a high LR), diagnosed
  online by the trainer's own monitor, and healthy default runs over several seeds.

    python benchmarks/bench_lead_time.py                      # everything (induced runs: ~6 min on 2 cores)
    python benchmarks/bench_lead_time.py --only fixtures zoo  # ~1 min: the fit set and the report set
    python benchmarks/bench_lead_time.py --only induced --steps 150 --jobs 2
    python benchmarks/bench_lead_time.py --only zoo --set forecast_windows=5  # the trade a team makes with its config
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import NormalDist

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]  # benchmarks.bench_lead_time (the reward below) and tests/zoo.py

from grpo_sentinel.telemetry.health.detectors import diagnose  # noqa: E402
from grpo_sentinel.telemetry.health.ingest import load  # noqa: E402
from grpo_sentinel.telemetry.health.lead import damage_step, lead_time  # noqa: E402
from grpo_sentinel.telemetry.health.table import BY_ID  # noqa: E402
from grpo_sentinel.telemetry.health.thresholds import (  # noqa: E402
    Thresholds,
    auto_window,
    configured,
    detector_window,
    parse_settings,
)

BOOK = REPO / "tests" / "fixtures" / "book-runs"
CHANGED: dict[str, int | float] = {}  # --set: thresholds other than the defaults, for every diagnosis below


def th(window: int = Thresholds.window) -> Thresholds:
    return configured(window, CHANGED)


def fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f}" if isinstance(x, float) else str(x)


# ---------------------------------------------------------------------------------------------
# Fixtures


def fixtures() -> list[dict]:
    out = []
    for name in ("ch06_rlvr_grpo_original_no_kl_metrics.csv", "7_4_plus_clip_ratio_metrics.csv"):
        log = load(BOOK / name)
        log.eval_n = 500  # MATH-500
        diag = diagnose(log, th())
        lead = lead_time(diag, log)
        critical = [c for c in diag.conditions if c.severity == "critical"]
        label = {"ch06": "ch06 (no KL)", "7_4_": "7_4 (clipped)"}[name[:4]]
        out.append({"source": label, **lead.as_dict(), "steps": len(log),
                    "criticals": sorted({c.id for c in critical})})
    return out


# ---------------------------------------------------------------------------------------------
# Zoo


SLOW = ("loss_blowup", "kl_acceleration", "entropy_drift", "length_drift", "format_hacking")
# The signal an oracle reads for each slow pathology (by the word in its generator's name): the one whose
# change is the damage's own evidence. Lengths and KL are the pathology itself; for entropy the row's critical
# needs the reward falling (an entropy rising alone is not damage: the book's stable 7_4 run), so the reward;
# for format hacking the correctness under the format reward. None for the loss: its noise is heavy-tailed,
# and a Gaussian bound says nothing there.
ORACLE_SIGNAL = {"length": "response_len", "kl": "kl", "entropy": "reward", "format": "reward_correct", "loss": None}
ORACLE_RATE = 1e-5  # false alarms a step: the detectors' own budget (loss_blowup_arl, acc_decline_rate)


def oracle_step(gen, runs: int = 200, rate: float = ORACLE_RATE) -> int | None:
    """The first step at which a test that knows the onset and the mean path of the pathology's signal
    (ORACLE_SIGNAL) could see it, at `rate` false alarms a step: the matched filter over the steps since
    the onset, sqrt(sum delta_t^2) / sigma >= z = Phi^-1(1 - rate), delta_t the mean path's departure from
    its level over the 40 steps before the onset, sigma the signal's per-step noise (its sd over `runs` seeds
    before the onset). The level, not the line before the onset: a healthy run's reward flattens (diminishing
    returns), so what it would have done next is not knowable, only where it stood. No detector that must also
    find the onset and the shape does better, so damage - this step bounds the lead any detector can reach at
    that rate (docs/lead-time.md in git history, fifth pass)."""
    import zoo

    signal = next((v for k, v in ORACLE_SIGNAL.items() if k in gen.__name__), None)
    if signal is None:
        return None
    onset, _ = zoo.truth(gen, 0)
    x = np.array([gen(np.random.default_rng(seed))[signal] for seed in range(runs)])  # [runs, N]
    mu, before = x.mean(0), np.arange(onset - 40, onset)
    delta = mu[onset:] - mu[before].mean()
    snr = np.sqrt(np.cumsum(delta**2)) / x[:, before].std(0).mean()
    seen = np.flatnonzero(snr >= NormalDist().inv_cdf(1 - rate))
    return int(onset + seen[0] + 1) if len(seen) else None  # a row's step is its index + 1 (zoo.truth's damage too)


def zoo_table(seeds, gens=None) -> list[dict]:
    """One row per pathology generator (default: the zoo's, the healthy ones aside) over `seeds`."""
    import zoo

    rows = []
    for gen in gens or zoo.ZOO:
        if gen in zoo.HEALTHY:
            continue
        fw, fc, wl, cl, dmg, onset = [], [], [], [], None, None
        for seed in seeds:
            onset, dmg = zoo.truth(gen, seed)
            log = zoo.make(gen, seed)
            lead = lead_time(diagnose(log, th()), log)
            fw.append(lead.first_warning if lead.first_warning is not None else np.nan)
            fc.append(lead.first_critical if lead.first_critical is not None else np.nan)
            if dmg is not None:
                wl.append(dmg - fw[-1])
                cl.append(dmg - fc[-1])

        def med(xs):
            return float(np.nanmedian(xs)) if len(xs) and not np.all(np.isnan(xs)) else None

        def lo(xs):
            return float(np.nanmin(xs)) if len(xs) and not np.all(np.isnan(xs)) else None

        def mean(xs):
            return float(np.nanmean(xs)) if len(xs) and not np.all(np.isnan(xs)) else None
        slow = gens is not None or gen.__name__ in SLOW  # the report sets' shapes are all slow ones
        oracle = oracle_step(gen) if slow and dmg is not None else None
        rows.append({"pathology": gen.__name__, "onset": onset, "damage": dmg, "first_warning": med(fw),
                     "oracle_lead": dmg - oracle if oracle is not None else None,
                     "first_critical": med(fc), "warning_lead": med(wl), "warning_lead_min": lo(wl),
                     "lead": med(cl), "lead_min": lo(cl), "lead_mean": mean(cl), "seeds": len(seeds),
                     "critical_before_damage": int(np.sum(np.asarray(cl) > 0)) if cl else 0})
    return rows


def false_pages(families, seeds) -> list[dict]:
    """Conditions on healthy runs of `families` over `seeds`, with the rows that fired."""
    import zoo

    out = []
    for gen in families:
        rows: dict[str, int] = {}
        warnings = criticals = steps = paged = 0
        for seed in seeds:
            log = zoo.make(gen, seed)
            steps += len(log)
            found = [c for c in diagnose(log, th()).conditions if c.severity != "info"]
            warnings += sum(c.severity == "warning" for c in found)
            criticals += sum(c.severity == "critical" for c in found)
            paged += bool(found)
            for cid in {f"{c.id} ({c.severity})" for c in found}:
                rows[cid] = rows.get(cid, 0) + 1
        out.append({"family": gen.__name__, "runs": len(seeds), "steps": steps, "warnings": warnings, "criticals": criticals,
                    "warnings_per_1000": 1000 * warnings / steps, "criticals_per_1000": 1000 * criticals / steps,
                    "runs_paged": paged, "runs_by_row": rows})
    return out


def print_zoo(rows: list[dict], label: str) -> None:
    print(f"zoo, {label} ({rows[0]['seeds']} seeds; medians, min in brackets) {'onset':>6} {'damage':>6} {'1st warn':>8} "
          f"{'1st crit':>8} {'warn lead':>11} {'lead':>11} {'oracle':>6}")
    for r in rows:
        print(f"  {r['pathology']:43} {fmt(r['onset']):>6} {fmt(r['damage']):>6} {fmt(r['first_warning']):>8} "
              f"{fmt(r['first_critical']):>8} {fmt(r['warning_lead']):>5} ({fmt(r['warning_lead_min']):>4}) "
              f"{fmt(r['lead']):>5} ({fmt(r['lead_min']):>4}) {fmt(r['oracle_lead']):>6}")
    import zoo

    slow_names = set(SLOW) | {g.__name__ for g in zoo.REPORT3_SLOW + zoo.REPORT4_SLOW + zoo.REPORT5_SLOW + zoo.REPORT6_SLOW
                                   + zoo.REPORT8_SLOW + zoo.REPORT9_SLOW + zoo.REPORT10_SLOW + zoo.REPORT11_SLOW
                                   + zoo.REPORT12_SLOW + zoo.REPORT13_SLOW + zoo.REPORT14_SLOW
                                   + zoo.REPORT15_SLOW + zoo.REPORT16_SLOW + zoo.REPORT17_SLOW}
    slow = [r for r in rows if r["pathology"] in slow_names]
    print(f"  slow pathologies ({label}): critical before the damage on "
          f"{sum(r['critical_before_damage'] for r in slow)} of {sum(r['seeds'] for r in slow)} runs; mean lead by pathology "
          + ", ".join(f"{r['pathology']} {fmt(r['lead_mean'])}" for r in slow)
          + f"; over all {fmt(float(np.mean([r['lead_mean'] for r in slow if r['lead_mean'] is not None])))} (target >= 20)")


def print_false_pages(rows: list[dict], label: str) -> None:
    for r in rows:
        print(f"  {label}: {r['family']:22} {r['runs']} runs, {r['steps']:,} steps: {r['warnings']} warnings "
              f"({r['warnings_per_1000']:.3f} / 1,000 steps), {r['criticals']} critical "
              f"({r['criticals_per_1000']:.3f} / 1,000 steps); runs paged {r['runs_paged']} "
              f"({100 * r['runs_paged'] / r['runs']:.1f} %) {r['runs_by_row'] or ''}")
    runs = sum(r["runs"] for r in rows)
    print(f"  {label}, all: {sum(r['criticals'] for r in rows)} critical; runs paged "
          f"{100 * sum(r['runs_paged'] for r in rows) / runs:.1f} % of {runs} (target: 0 critical, <= 2 %)")


# ---------------------------------------------------------------------------------------------
# Induced runs on the tiny model


def long_answer(completion: str, answer: str, prompt: str) -> float:
    """A gameable auxiliary reward: pays for length (up to 6 characters), right or wrong. The policy
    learns to pad, the padded answers stop being right, and the combined reward holds."""
    return min(len(completion.strip()), 6) / 6


class Drift:
    """A StepSink that moves one setting a little every step (the trainer reads its config every step)."""

    def __init__(self, cfg, section: str, name: str, start: float, end: float, steps: int):
        self.cfg, self.section, self.name, self.start_, self.end, self.steps = cfg, section, name, start, end, steps

    def start(self, info) -> None:
        setattr(getattr(self.cfg, self.section), self.name, self.start_)

    def on_step(self, stats) -> None:
        frac = min(1.0, stats.step / self.steps)
        setattr(getattr(self.cfg, self.section), self.name, self.start_ + (self.end - self.start_) * frac)

    def close(self) -> None:
        pass


INDUCED = {
    # name: (overrides ({steps} = the run's length), drift (section, field, start, end) or None)
    "lr 1e-2 (fast collapse)": (["optim.lr=1e-2"], None),
    "lr rising 0 -> 2e-2 over the run": (["optim.lr=2e-2", "optim.warmup_steps={steps}"], None),
    "beta decaying 0.5 -> 0, lr 6e-3": (["optim.lr=6e-3", "grpo.beta=0.5"], ("grpo", "beta", 0.5, 0.0)),
    "gameable length reward, lr 3e-3": (["optim.lr=3e-3",
                                         "rewards=[{name: correct}, {name: 'benchmarks.bench_lead_time:long_answer'}]"], None),
    "temperature drifting 1.0 -> 3.0": ([], ("grpo", "temperature", 1.0, 3.0)),
}


def real_damage(log) -> int | None:
    """The damage beyond the evaluation's sampling noise: held-out accuracy 10 % below its running
    peak *and* 2 standard errors of a difference of two evaluations below it (2 sqrt 2 sqrt(p(1-p)/n)).
    On the tiny model (p ~ 0.2, n = 200: SE 2.8 points) a 10 % relative fall is 2 points, inside the
    noise: healthy runs 'damage' themselves by that definition; this column says when it is real."""
    s = log.series
    if not log.has("sample_acc") or not log.eval_n:
        return None
    ok = np.isfinite(s["sample_acc"])
    steps, acc = s["step"][ok], s["sample_acc"][ok]
    if log.baseline_acc is not None:
        steps, acc = np.concatenate([[0.0], steps]), np.concatenate([[log.baseline_acc], acc])
    peak = np.maximum.accumulate(acc)
    noise = 2 * math.sqrt(2) * np.sqrt(peak * (1 - peak) / log.eval_n)
    hit = np.flatnonzero((acc <= 0.9 * peak) & (peak - acc >= noise))
    return int(steps[hit[0]]) if len(hit) else None


def induced_run(name: str, overrides: list[str], drift, steps: int, seed: int, out: str, index: int) -> dict:
    import logging

    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.trainer import Trainer

    logging.disable(logging.WARNING)
    cfg = load_config(None, [o.replace("{steps}", str(steps)) for o in overrides] +
                      ["run.sample_every=10", "health.stop_on=[]", f"run.seed={seed}", "telemetry.prometheus=false"],
                      **{"run.steps": steps})
    run_dir = Path(out) / f"run{index}-seed{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "bench.json").write_text(json.dumps({"run": name, "seed": seed}))
    sinks = [Drift(cfg, *drift, steps)] if drift else []
    Trainer(cfg, run_dir, sinks=sinks).run()
    return score(run_dir, name, seed)


def score(run_dir: Path, name: str, seed: int) -> dict:
    """One induced run's row: the online monitor's first verdicts (summary.json), the damage, the leads;
    and whether `diagnose` on the record finds the same conditions (it must: the monitor is diagnose)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    seen = summary["health_conditions"]  # the online monitor's verdicts: condition -> first step
    log = load(run_dir)
    window = detector_window(log.window, log.completions_per_step)
    diag = diagnose(log, th(window))
    offline = {c.id for c in diag.conditions}
    first = {
        sev: min(((s, c) for c, s in seen.items() if BY_ID[c].severity == sev), default=(None, ""))
        for sev in ("warning", "critical")
    }
    dmg, words, _, _ = damage_step(log, th(window))
    real = real_damage(log)

    def lead(d, a):
        return None if d is None or a is None else d - a
    return {"run": name, "seed": seed, "dir": str(run_dir), "damage": dmg, "damage_words": words, "real_damage": real,
            "first_warning": first["warning"][0], "warning": first["warning"][1],
            "first_critical": first["critical"][0], "critical": first["critical"][1],
            "lead": lead(dmg, first["critical"][0]), "warning_lead": lead(dmg, first["warning"][0]),
            "real_lead": lead(real, first["critical"][0]), "real_warning_lead": lead(real, first["warning"][0]),
            "warnings": sum(BY_ID[c].severity == "warning" for c in seen), "conditions": seen,
            "offline_agrees": offline == set(seen), "steps": summary["step"],
            "baseline": summary["baseline"]["sample_acc"], "final": summary["final_eval"]["sample_acc"]}


def rescore(runs: Path) -> list[dict]:
    """Rows from kept run directories (--keep), diagnosed offline with the detectors as they are now:
    the same verdicts the monitor would give (tests/test_monitor_streaming.py), without retraining."""
    names = list(INDUCED) + ["healthy (defaults)"] * 100
    rows = []
    for run_dir in sorted(runs.iterdir(), key=lambda p: int(p.name[3:].split("-")[0])):
        if not (run_dir / "summary.json").is_file():
            continue  # still training, or failed
        meta = json.loads((run_dir / "bench.json").read_text()) if (run_dir / "bench.json").is_file() else \
            {"run": names[int(run_dir.name[3:].split("-")[0])], "seed": int(run_dir.name.split("seed")[1])}
        row = score(run_dir, meta["run"], meta["seed"])
        d = diagnose(load(run_dir), th(auto_window(64)))
        firsts = {}
        for c in d.conditions:  # the verdicts of today's detectors (the monitor's, step for step)
            firsts.setdefault(c.id, c.first_step)
        row["conditions"] = firsts
        for sev in ("warning", "critical"):
            cs = [(c.first_step, c.id) for c in d.conditions if c.severity == sev]
            row[f"first_{sev}"], row[sev] = min(cs) if cs else (None, "")
        for key, dmg, sev in (
            ("lead", row["damage"], "critical"),
            ("warning_lead", row["damage"], "warning"),
            ("real_lead", row["real_damage"], "critical"),
            ("real_warning_lead", row["real_damage"], "warning"),
        ):
            row[key] = None if dmg is None or row[f"first_{sev}"] is None else dmg - row[f"first_{sev}"]
        row["warnings"] = sum(c.severity == "warning" for c in d.conditions)
        row["offline_agrees"] = True
        rows.append(row)
    return rows


def induced(steps: int, healthy_seeds: list[int], jobs: int, keep: Path | None) -> list[dict]:
    from grpo_sentinel.service.demo import demo_model_dir

    demo_model_dir()  # built once, before the workers start
    runs = [(name, ov, drift, 0) for name, (ov, drift) in INDUCED.items()]
    runs += [("healthy (defaults)", [], None, s) for s in healthy_seeds]
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(jobs) as pool:
        out = str(keep) if keep else tmp
        futures = [
            pool.submit(induced_run, name, ov, drift, steps, seed, out, i)
            for i, (name, ov, drift, seed) in enumerate(runs)
        ]
        rows = []
        for (name, _, _, seed), f in zip(runs, futures):
            try:
                rows.append(f.result())
            except Exception as e:  # noqa: BLE001 - one failed run must not lose the others' hour of training
                rows.append({"run": name, "seed": seed, "error": f"{type(e).__name__}: {e}"})
        return rows


# ---------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=["fixtures", "zoo", "induced"], default=["fixtures", "zoo", "induced"])
    ap.add_argument("--seeds", type=int, default=20, help="zoo seeds per pathology")
    ap.add_argument("--healthy-runs", type=int, default=300, help="simulated healthy runs per family")
    ap.add_argument("--steps", type=int, default=150, help="steps of each induced run")
    ap.add_argument("--healthy-seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", type=int, default=2, help="induced runs in parallel")
    ap.add_argument("--logs", type=Path, default=REPO.parent / "shared" / "wild",
                    help="where the real corpus's fetched logs lie (benchmarks/bench_wild.py --logs)")
    ap.add_argument("--json", type=Path, help="also write every number as JSON here")
    ap.add_argument("--keep", type=Path, help="keep the induced runs' directories here (default: a temporary folder)")
    ap.add_argument("--rescore", type=Path, metavar="DIR", help="no training: score the induced runs kept in DIR (--keep) "
                                                                "with today's detectors")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a threshold other than its default (telemetry/health/thresholds.py) for every diagnosis here, as a "
                         "run's health.thresholds sets it; the induced runs' own monitors keep the defaults")
    args = ap.parse_args()
    try:
        CHANGED.update(parse_settings(args.set))
    except ValueError as e:
        ap.error(str(e))
    report: dict = {"thresholds_changed": dict(CHANGED)}
    if "fixtures" in args.only:
        report["fixtures"] = rows = fixtures()
        print(f"{'real log':16} {'1st warning':>20} {'1st critical':>20} {'damage':>6} {'lead':>5} {'warn lead':>9}")
        for r in rows:
            print(f"{r['source']:16} {fmt(r['first_warning']) + ' ' + r['warning']:>20} "
                  f"{fmt(r['first_critical']) + ' ' + r['critical']:>20} {fmt(r['damage_step']):>6} {fmt(r['lead']):>5} "
                  f"{fmt(r['warning_lead']):>9}")
        print()
    if "zoo" in args.only:
        import zoo

        # The fit set: the families and seeds the thresholds and the detectors' designs were chosen on.
        # The report set: other shapes of the same kinds of noise and other seeds, never used to choose
        # anything (tests/zoo.py says which is which; docs/explanation/lead-time.md what was fitted on what).
        report["zoo"] = fit = zoo_table(range(args.seeds))
        print_zoo(fit, "fit set, seeds 0-%d" % (args.seeds - 1))
        # The first report set was seen failing and the held-out declines, loss_blowup and the drift rows'
        # escalation were changed after it: it is "seen" now. Report set 2 (zoo.REPORT2_HEALTHY, seeds
        # 2000-2299; the pathologies' seeds 2000-2019) was declared here before any detector ran on it.
        report["zoo_report"] = held = zoo_table(range(1000, 1000 + args.seeds))
        print_zoo(held, "seen report set, seeds 1000-%d" % (999 + args.seeds))
        report["zoo_report2"] = held2 = zoo_table(zoo.SLOW_REPORT2_SEEDS[:args.seeds])
        print_zoo(held2, "report set 2, seeds 2000-%d" % (1999 + min(args.seeds, len(zoo.SLOW_REPORT2_SEEDS))))
        # Report sets 3-6 and 8-17: new shapes of the slow pathologies (and new healthy families, below), each committed
        # before any detector ran on it and measured once; docs/explanation/lead-time.md says what was fitted on what.
        for k, gens, seeds, label in ((3, zoo.REPORT3_SLOW, zoo.SLOW_REPORT3_SEEDS, "new shapes, seen"),
                                      (4, zoo.REPORT4_SLOW, zoo.SLOW_REPORT4_SEEDS, "new shapes, seen"),
                                      (5, zoo.REPORT5_SLOW, zoo.SLOW_REPORT5_SEEDS, "new shapes, seen"),
                                      (6, zoo.REPORT6_SLOW, zoo.SLOW_REPORT6_SEEDS, "new shapes"),
                                      (8, zoo.REPORT8_SLOW, zoo.SLOW_REPORT8_SEEDS, "new shapes, seen"),
                                      (9, zoo.REPORT9_SLOW, zoo.SLOW_REPORT9_SEEDS, "new shapes"),
                                      (10, zoo.REPORT10_SLOW, zoo.SLOW_REPORT10_SEEDS, "new shapes, seen"),
                                      (11, zoo.REPORT11_SLOW, zoo.SLOW_REPORT11_SEEDS, "new shapes, seen"),
                                      (12, zoo.REPORT12_SLOW, zoo.SLOW_REPORT12_SEEDS, "new shapes"),
                                      (13, zoo.REPORT13_SLOW, zoo.SLOW_REPORT13_SEEDS, "new shapes, seen"),
                                      (14, zoo.REPORT14_SLOW, zoo.SLOW_REPORT14_SEEDS, "new shapes, seen"),
                                      (15, zoo.REPORT15_SLOW, zoo.SLOW_REPORT15_SEEDS, "new shapes, seen"),
                                      (16, zoo.REPORT16_SLOW, zoo.SLOW_REPORT16_SEEDS, "new shapes, seen"),
                                      (17, zoo.REPORT17_SLOW, zoo.SLOW_REPORT17_SEEDS, "new shapes")):
            report[f"zoo_report{k}"] = rows = zoo_table(seeds[:args.seeds], gens)
            print_zoo(rows, f"report set {k} ({label}), seeds {seeds[0]}-{seeds[0] - 1 + min(args.seeds, len(seeds))}")
        runs = min(args.healthy_runs, len(zoo.FIT_SEEDS))
        for key, label, families, seeds in (
                ("false_pages", "fit set", zoo.FIT_HEALTHY, zoo.FIT_SEEDS),
                ("false_pages_report", "seen report set", zoo.REPORT_HEALTHY, zoo.REPORT_SEEDS),
                ("false_pages_report2", "report set 2", zoo.REPORT2_HEALTHY, zoo.REPORT2_SEEDS),
                ("false_pages_report3", "report set 3 (seen)", zoo.REPORT3_HEALTHY, zoo.REPORT3_SEEDS),
                ("false_pages_report4", "report set 4 (seen)", zoo.REPORT4_HEALTHY, zoo.REPORT4_SEEDS),
                ("false_pages_report5", "report set 5 (seen)", zoo.REPORT5_HEALTHY, zoo.REPORT5_SEEDS),
                ("false_pages_report6", "report set 6", zoo.REPORT6_HEALTHY, zoo.REPORT6_SEEDS),
                ("false_pages_report7", "report set 7", zoo.REPORT7_HEALTHY, zoo.REPORT7_SEEDS),  # 7: healthy only
                ("false_pages_report8", "report set 8 (seen)", zoo.REPORT8_HEALTHY, zoo.REPORT8_SEEDS),
                ("false_pages_report9", "report set 9", zoo.REPORT9_HEALTHY, zoo.REPORT9_SEEDS),
                ("false_pages_report10", "report set 10 (seen)", zoo.REPORT10_HEALTHY, zoo.REPORT10_SEEDS),
                ("false_pages_report11", "report set 11 (seen)", zoo.REPORT11_HEALTHY, zoo.REPORT11_SEEDS),
                ("false_pages_report12", "report set 12", zoo.REPORT12_HEALTHY, zoo.REPORT12_SEEDS),
                ("false_pages_report13", "report set 13 (seen)", zoo.REPORT13_HEALTHY, zoo.REPORT13_SEEDS),
                ("false_pages_report14", "report set 14 (seen)", zoo.REPORT14_HEALTHY, zoo.REPORT14_SEEDS),
                ("false_pages_report15", "report set 15 (seen)", zoo.REPORT15_HEALTHY, zoo.REPORT15_SEEDS),
                ("false_pages_report16", "report set 16 (seen)", zoo.REPORT16_HEALTHY, zoo.REPORT16_SEEDS),
                ("false_pages_report17", "report set 17", zoo.REPORT17_HEALTHY, zoo.REPORT17_SEEDS)):
            report[key] = rows = false_pages(families, seeds[:runs])
            print_false_pages(rows, label)
        from benchmarks import bench_wild

        report["corpus"] = corpus = bench_wild.tally(bench_wild.evaluate(logs=args.logs, changed=CHANGED))
        print(f"  report set: the real corpus (benchmarks/bench_wild.py, logs from {args.logs}): {bench_wild.summary(corpus)}")
        print()
    if "induced" in args.only:
        rows = rescore(args.rescore) if args.rescore else induced(args.steps, args.healthy_seeds, args.jobs, args.keep)
        report["induced"] = rows
        print(f"tiny model, {args.steps} steps {'1st warning':>24} {'1st critical':>20} {'damage':>6} {'lead':>5} "
              f"{'warn':>5} | {'real':>4} {'lead':>5} {'warn':>5}  accuracy")
        pages = warnings = steps = 0
        for r in rows:
            label = r["run"] + (f" seed {r['seed']}" if r["run"].startswith("healthy") else "")
            if "error" in r:
                print(f"  {label:34} failed: {r['error']}")
                continue
            print(
                f"  {label:34} {fmt(r['first_warning']) + ' ' + r['warning']:>22} "
                f"{fmt(r['first_critical']) + ' ' + r['critical']:>20} "
                f"{fmt(r['damage']):>6} {fmt(r['lead']):>5} {fmt(r['warning_lead']):>5} | {fmt(r['real_damage']):>4} "
                f"{fmt(r['real_lead']):>5} {fmt(r['real_warning_lead']):>5}  {r['baseline']:.3f} -> {r['final']:.3f}"
                f"{'' if r['offline_agrees'] else '  (offline differs)'}"
            )
            if r["run"].startswith("healthy"):
                pages += sum(BY_ID[c].severity == "critical" for c in r["conditions"])
                warnings += r["warnings"]
                steps += r["steps"]
        print(f"  healthy demo runs: {pages} critical and {warnings} warning conditions in {steps} steps")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
