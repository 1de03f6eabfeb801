"""telemetry/session.py: the rules both trainers follow, and one RunSession through a whole run (the real
record, monitor and files; a sink that fails is counted, and the run goes on)."""

import csv
import json
import math
import subprocess

from grpo_sentinel.telemetry import runfiles
from grpo_sentinel.telemetry.health.thresholds import detector_window
from grpo_sentinel.telemetry.schema import Eval, RunInfo, StepStats
from grpo_sentinel.telemetry.session import RunSession, max_reward, run_scales
from grpo_sentinel.telemetry.settings import HealthSettings
from helpers import cli


def test_the_largest_reward_and_the_window():
    assert max_reward([1.0, 0.5, -1.0]) == 1.5  # negative weights cannot add to the maximum
    assert max_reward([0.2]) == 1.0  # at least 1: a 0/1 verifier alone
    # ~400 completions: ceil(400 / 64) = 7 rows of 8 x 8; rows of 2 steps of 16 completions: ceil(400 / 32) = 13.
    assert detector_window(None, 64) == 7 and detector_window(None, 2 * 16) == 13
    assert detector_window(9, 64) == 9 and detector_window(None, None) == 20  # configured wins; unknown: 20 rows
    s = run_scales(ln_vocab=math.log(15), max_new_tokens=6, group_size=4, prompts_per_step=4,
                   rewards=[("correct", 1.0), ("short", 0.5)], steps_per_row=2)
    assert (s.max_reward, s.window, s.reward_weights) == (1.5, 13, {"correct": 1.0, "short": 0.5})
    assert run_scales(ln_vocab=1.0, max_new_tokens=6, group_size=4, prompts_per_step=4, rewards=[("c", 1.0)],
                      largest_reward=3.0).max_reward == 3.0  # the user's own figure


class Failing:
    """A sink whose backend is gone: every step raises."""

    def start(self, info):
        pass

    def on_step(self, stats):
        raise OSError("backend gone")

    def close(self):
        pass


def test_one_session_through_a_run(tmp_path):
    scales = run_scales(ln_vocab=math.log(15), max_new_tokens=6, group_size=4, prompts_per_step=2,
                        rewards=[("correct", 1.0)], window=3)
    info = RunInfo("r", "demo", "grpo", scales, traces_project="p1")
    session = RunSession(tmp_path, steps=4, sinks=[Failing()], health=HealthSettings(stop_on=[]),
                         origin={"trainer": "x"})
    session.begin(0)
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "running"
    session.start(info)
    assert runfiles.read_run_info(tmp_path / "run.json") == info
    session.baseline(Eval(sample_acc=0.25, greedy_acc=0.5, n=8))
    for step in range(1, 5):
        ev = Eval(sample_acc=0.5, greedy_acc=math.nan, n=8) if step == 4 else None
        stats, verdict = session.step(StepStats.partial(step, reward=0.5, adv_mean=0.3, invalid_rewards=step, eval=ev))
        assert verdict is not None and stats.health == tuple(c.id for c in verdict.active)
    session.close("completed", 4)
    summary = json.loads((tmp_path / "summary.json").read_text())
    # adv_mean 0.3 is the implementation-bug sentinel: active from the first step.
    assert summary["health_conditions"].get("adv_mean_drift") == 1, summary["health_conditions"]
    assert summary["baseline"] == {"sample_acc": 0.25, "greedy_acc": 0.5, "n": 8}
    assert summary["final_eval"] == {"sample_acc": 0.5, "greedy_acc": None, "n": 8} and summary["final_eval_step"] == 4
    assert summary["invalid_rewards"] == 1 + 2 + 3 + 4 and summary["trainer"] == "x"
    assert summary["status"] == "completed" and summary["telemetry_errors"] == 4  # the failing sink, every step
    rows = list(csv.DictReader((tmp_path / "steps.csv").open()))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"] and "adv_mean_drift" in rows[0]["health"].split()
    curve = list(csv.DictReader((tmp_path / "reward-vs-step.csv").open()))
    assert [(r["step"], r["sample_acc"]) for r in curve] == [("0", "0.25"), ("4", "0.5")]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e.get("trainer")) for e in events] == [("started", "x"), ("ended", None)]


def test_changed_thresholds_judge_the_run_online_and_offline(tmp_path):
    """health.thresholds reach the online monitor and run.json, and `grpo-sentinel diagnose` reads them back from
    it: |adv_mean| 0.3 is the implementation-bug sentinel at the default tolerance (1e-3), not at a tolerance of 0.5.
    `diagnose` refuses a run.json whose threshold is outside its domain, naming the file and the threshold."""
    for changed, flagged in (({}, True), ({"adv_mean_tol": 0.5}, False)):
        run = tmp_path / ("changed" if changed else "default")
        run.mkdir()
        health = HealthSettings(stop_on=[], halt_on=[], thresholds=changed)
        scales = run_scales(ln_vocab=math.log(15), max_new_tokens=6, group_size=4, prompts_per_step=2,
                            rewards=[("correct", 1.0)], window=3, thresholds=health.thresholds)
        session = RunSession(run, steps=8, health=health)
        session.begin(0)
        session.start(RunInfo("r", "demo", "grpo", scales))
        for step in range(1, 9):
            session.step(StepStats.partial(step, reward=0.5, adv_mean=0.3))
        session.close("completed", 8)
        online = json.loads((run / "summary.json").read_text())["health_conditions"]
        assert ("adv_mean_drift" in online) is flagged, online
        assert runfiles.read_run_info(run / "run.json").scales.thresholds == changed
        offline = json.loads(subprocess.run(cli("diagnose", str(run), "--json"), capture_output=True, text=True).stdout)
        assert ("adv_mean_drift" in {c["id"] for c in offline["conditions"]}) is flagged, offline["conditions"]
    info = json.loads((run / "run.json").read_text())
    info["scales"]["thresholds"] = {"truncation": 2.0}
    (run / "run.json").write_text(json.dumps(info))
    refused = subprocess.run(cli("diagnose", str(run)), capture_output=True, text=True)
    assert refused.returncode != 0 and "run.json: scales.thresholds: truncation=2.0: truncation is a fraction" in refused.stderr
