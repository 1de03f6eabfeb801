"""Lead time: induced pathologies on the tiny model, diagnosed online by the trainer's own monitor.

For each config: the step of the first warning and first critical condition, the step where
held-out sample_acc first falls 10 % below its running peak (the damage), and the lead in steps
(damage step - first alert; positive = paged before the damage). Healthy default runs over
several seeds count critical conditions (goal: 0).

    python benchmarks/bench_lead_time.py [--steps 150] [--healthy-seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from grpo_sentinel.telemetry.health.table import BY_ID

INDUCED = {
    "high_lr (1e-2)": ["optim.lr=1e-2"],
    "high_lr (4e-3)": ["optim.lr=4e-3"],
    "huge_beta (plateau_kl_flat)": ["grpo.beta=20"],
    "format_only_reward (reward_hacking)": ["rewards=[{name: format}]"],
    "cold_sampling_high_lr (entropy_collapse)": ["grpo.temperature=0.3", "optim.lr=5e-3"],
}


def run(name: str, overrides: list[str], steps: int, out: Path) -> dict:
    args = [sys.executable, "-m", "grpo_sentinel.service.cli", "train", "--steps", str(steps), "--out", str(out),
            "--set", f"run.run_id={name}", "--set", "run.sample_every=10", "--set", "telemetry.prometheus=false",
            "--set", "health.stop_on=[]"]
    for o in overrides:
        args += ["--set", o]
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = out / name
    summary = json.loads((run_dir / "summary.json").read_text())
    curve = list(csv.DictReader((run_dir / "reward-vs-step.csv").open()))
    peak, damage = 0.0, None
    for r in curve:
        acc = float(r["sample_acc"])
        peak = max(peak, acc)
        if damage is None and peak > 0 and acc < 0.9 * peak:
            damage = int(r["step"])
    seen = summary["health_conditions"]
    first = {sev: min((s for c, s in seen.items() if BY_ID[c].severity == sev), default=None)
             for sev in ("warning", "critical")}
    return {"conditions": seen, "first": first, "damage": damage}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--healthy-seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'config':42} {'1st warning':>11} {'1st critical':>12} {'acc -10 %':>9} {'lead':>5}  conditions")
        for i, (name, overrides) in enumerate(INDUCED.items()):
            r = run(f"induced{i}", overrides, args.steps, Path(tmp))
            alert = min((s for s in r["first"].values() if s is not None), default=None)
            lead = r["damage"] - alert if r["damage"] is not None and alert is not None else None
            fmt = lambda x: "-" if x is None else str(x)
            print(f"{name:42} {fmt(r['first']['warning']):>11} {fmt(r['first']['critical']):>12} {fmt(r['damage']):>9} "
                  f"{fmt(lead):>5}  {', '.join(f'{c}@{s}' for c, s in sorted(r['conditions'].items(), key=lambda kv: kv[1]))}",
                  flush=True)
        pages = 0
        for seed in args.healthy_seeds:
            r = run(f"healthy{seed}", [f"run.seed={seed}"], args.steps, Path(tmp))
            crit = [c for c in r["conditions"] if BY_ID[c].severity == "critical"]
            pages += len(crit)
            print(f"healthy seed {seed}: conditions {r['conditions'] or 'none'}", flush=True)
        print(f"critical conditions on {len(args.healthy_seeds)} healthy runs: {pages}")


if __name__ == "__main__":
    main()
