"""The README's first command, as a user runs it: the default demo trains 300 steps and learns."""

import csv
import json
import statistics
import subprocess

import pytest

from helpers import cli

pytestmark = pytest.mark.slow  # the second tier (README, Tests)

# Measured over seeds 0-3 (`python benchmarks/bench_learning.py --seeds 0 1 2 3`): the held-out
# sample_acc gain, end (mean of the last three sampling points) minus step 0, was +0.093 to
# +0.120 (mean +0.103, sd 0.012; greedy +0.127 to +0.192). The margin is about half the smallest
# gain and 4 sd below the mean, and above the standard error of an accuracy difference on
# n = 200 (sqrt(0.15 * 0.85 / 200 + 0.27 * 0.73 / 200) ~ 0.040): a run that did not learn
# cannot pass, and seed-to-seed noise does not fail one that did.
MARGIN = 0.05


def test_default_demo_learns_and_writes_the_record(tmp_path, demo_dir):
    p = subprocess.run(cli("train", "--out", str(tmp_path)), capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    run_dir = tmp_path / p.stdout.strip().splitlines()[-1].rsplit(": ", 1)[1].split("/")[-1]
    assert p.stdout.strip().endswith(str(run_dir))

    with (run_dir / "reward-vs-step.csv").open() as f:
        header = next(csv.reader(f))
    assert header[:5] == ["step", "reward", "kl", "loss", "sample_acc"]
    curve = list(csv.DictReader((run_dir / "reward-vs-step.csv").open()))
    assert [int(r["step"]) for r in curve] == list(range(0, 301, 20))  # 16 rows
    steps = list(csv.DictReader((run_dir / "steps.csv").open()))
    assert [int(r["step"]) for r in steps] == list(range(1, 301))
    assert all(r["skipped"] == "" for r in steps)

    acc = [float(r["sample_acc"]) for r in curve]
    gain = statistics.mean(acc[-3:]) - acc[0]
    assert gain >= MARGIN, f"held-out sample_acc {acc[0]:.3f} -> {statistics.mean(acc[-3:]):.3f}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 300
    assert summary["baseline"]["sample_acc"] == acc[0]
    from grpo_sentinel.telemetry.health.table import BY_ID

    # the healthy default run pages nobody
    assert not [c for c in summary["health_conditions"] if BY_ID[c].severity == "critical"], summary["health_conditions"]
