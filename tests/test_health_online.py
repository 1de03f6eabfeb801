"""The monitor inside a real training run: conditions become log events, metrics, CSV, actions."""

import csv
import json

import pytest

from grpo_sentinel.service.config import load_config
from grpo_sentinel.service.trainer import Trainer
from helpers import new_run


def constant(completion, answer, prompt):
    return 1.0  # every group all-equal: no learning signal at all


def run(tmp_path, *overrides, steps=30):
    cfg = load_config(None, ["rewards=[{name: 'tests.test_health_online:constant'}]", "health.window=5",
                             "run.sample_every=10", "run.checkpoint_every=2", *overrides], **{"run.steps": steps})
    return Trainer(cfg, new_run(tmp_path, cfg)).run_to_end()


def test_a_condition_in_stop_on_ends_the_run_early_with_a_checkpoint(tmp_path, demo_dir):
    result = run(tmp_path, "health.stop_on=[signal_vanished]")
    assert (result.status, result.exit_code) == ("stopped_early", 0)
    assert result.step == 5  # the first full 5-step window in which every group had no signal
    rows = list(csv.DictReader((tmp_path / "r" / "steps.csv").open()))
    assert [r["health"] for r in rows][-1] == "signal_vanished"
    assert all(float(r["frac_zero_std"]) == 1.0 for r in rows)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "stopped_early" and summary["health_conditions"] == {"signal_vanished": 5}
    assert (tmp_path / "r" / "checkpoints" / "step-00000005" / "manifest.json").is_file()
    # warning only: every checkpoint so far was taken while no critical condition was active
    assert json.loads((tmp_path / "r" / "checkpoints" / "last-healthy" / "manifest.json").read_text())["step"] == 5


@pytest.mark.slow
def test_a_condition_in_halt_on_halts(tmp_path, demo_dir):
    result = run(tmp_path, "health.halt_on=[signal_vanished]", "health.stop_on=[]")
    assert (result.status, result.exit_code, result.step) == ("halted", 3, 5)


@pytest.mark.slow
def test_without_actions_the_run_continues_and_records_the_condition(tmp_path, demo_dir):
    result = run(tmp_path, "health.stop_on=[]", steps=8)
    assert result.status == "completed"
    rows = list(csv.DictReader((tmp_path / "r" / "steps.csv").open()))
    assert [r["health"] for r in rows] == [""] * 4 + ["signal_vanished"] * 4


@pytest.mark.slow
def test_induced_collapse_high_learning_rate(tmp_path, demo_dir):
    """lr 1e-2 (10x the demo's) on the tiny model: every group loses its signal (all wrong), KL climbs
    past 2 per token and held-out accuracy falls to ~0. The monitor must name it."""
    cfg = load_config(None, ["optim.lr=1e-2", "run.sample_every=20", "health.stop_on=[]"], **{"run.steps": 60})
    result = Trainer(cfg, new_run(tmp_path, cfg)).run_to_end()
    seen = json.loads((tmp_path / "r" / "summary.json").read_text())["health_conditions"]
    assert result.status == "completed"
    assert "signal_vanished" in seen
    assert {"kl_runaway", "kl_dominant"} & set(seen)


def test_the_monitor_knows_the_group_size(tmp_path, demo_dir):
    """plateau_small_group needs G: with G = 4 and no signal, the trainer names it after two windows."""
    run(tmp_path, "grpo.group_size=4", "health.stop_on=[]", steps=12)
    seen = json.loads((tmp_path / "r" / "summary.json").read_text())["health_conditions"]
    assert seen.get("plateau_small_group") == 10, seen  # two full 5-step windows
