"""SentinelCallback on the real TRL 1.16 GRPOTrainer (the embedded demo model, fp32, CPU): a run scraped
by a real Prometheus with the alert rules; a saturating reward that stops TRL early; two processes
(gloo) that make one run; the built wheel; diagnose on TRL's output_dir; and what fails before training.
"""

import contextlib
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from packaging.requirements import Requirement

import trl_run
from grpo_sentinel.integrations import trl_stats
from grpo_sentinel.integrations.trl import NOT_FED, SUPPORTED, WITH_VLLM, SentinelCallback, SentinelSetupError
from grpo_sentinel.telemetry import dashboard, runfiles
from grpo_sentinel.telemetry.catalogue import CATALOGUE
from helpers import REPO, cli, free_port, prometheus_server, query_range, wait_for

STEPS, EVAL_EVERY, EVAL_PROMPTS = 12, 6, 4  # 12 rows: the monitor's early entropy baseline needs 10


def records(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def num(v: str) -> float:
    return float(v) if v != "" else math.nan


@pytest.fixture(scope="module")
def run(tmp_path_factory, demo_dir):
    """One TRL run with the callback and wrapped rewards (a verifier and an auxiliary bonus), logging every
    step, evaluating at steps 0, 6 and 12, writing TRL's completions parquet files, scraped by Prometheus."""
    tmp = tmp_path_factory.mktemp("trl")
    with prometheus_server(tmp) as (query, target, web):
        cb = SentinelCallback(out_dir=tmp / "runs", run_id="trl", telemetry={"prometheus_port": target, "linger_s": 1.5},
                              health={"window": 4})
        t0 = time.time()
        trainer = trl_run.trainer(demo_dir, tmp / "out", cb, SentinelCallback.wrap_rewards([trl_run.correct, trl_run.short]),
                                  eval_rows=EVAL_PROMPTS, max_steps=STEPS, eval_steps=EVAL_EVERY, eval_on_start=True,
                                  log_completions=True)
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            trainer.train()
        trainer.save_state()  # trainer_state.json in output_dir, as TRL's scripts leave it
        # The scrape that saw the last step (the callback lingers 1.5 s after it), before the server stops.
        assert wait_for(lambda: query('last_over_time(grpo_step{run_id="trl"}[5m])') and
                        float(query('last_over_time(grpo_step{run_id="trl"}[5m])')[0]["value"][1]) == STEPS, 30, 0.2)
        names = set(json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/label/__name__/values"))["data"])
        rules = json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/rules"))["data"]["groups"]
        board = dashboard.build()
        grafana = {"$job": "grpo", "$run": "trl", "$window": "2s", "$__rate_interval": "1s", "$__range": "1m"}
        panels = {}
        for title, expr in dashboard.queries(board):
            for var, value in grafana.items():
                expr = expr.replace(var, value)
            panels[f"{title}: {expr}"] = bool(query_range(web, expr, t0, time.time()))
        last = {e: float(r[0]["value"][1]) for e in ("grpo_steps_total", "grpo_completions_total", "grpo_reward_count")
                if (r := query(f'sum(last_over_time({e}{{run_id="trl"}}[5m]))'))}
    yield {"cb": cb, "dir": tmp / "runs" / "trl", "out": tmp / "out", "history": trainer.state.log_history,
           "names": names, "rules": rules, "panels": panels, "last": last, "said": said.getvalue(), "port": target}


def test_prometheus_scrapes_every_series_trl_can_feed_and_none_it_cannot(run):
    fed = {n for m in CATALOGUE if m.name not in {*NOT_FED, *WITH_VLLM} for n in m.prometheus_names()}
    assert fed <= run["names"], f"TRL feeds these, the scrape lacks them: {sorted(fed - run['names'])}"
    absent = {n for m in CATALOGUE if m.name in {*NOT_FED, *WITH_VLLM} for n in m.prometheus_names()}  # no vLLM here
    assert not absent & run["names"], "a series TRL cannot feed was invented"
    # Counted once per optimizer step and per completion (4 prompts x G = 4 a step).
    assert run["last"] == {"grpo_steps_total": STEPS, "grpo_completions_total": STEPS * 16, "grpo_reward_count": STEPS * 16}


def test_the_callback_says_once_where_the_record_and_the_metrics_are(run):
    lines = [ln for ln in run["said"].splitlines() if ln.startswith("grpo-sentinel: the run record is in")]
    assert len(lines) == 1 and str(run["dir"]) in lines[0] and f"http://127.0.0.1:{run['port']}/metrics" in lines[0]


def test_the_committed_rules_and_dashboard_work_unchanged(run):
    broken = [(r["name"], r.get("lastError")) for g in run["rules"] for r in g["rules"] if r["health"] != "ok"]
    assert not broken, broken
    # Every panel has data but those reading what TRL cannot feed (per-completion KL and entropy, per-rank times) or
    # feeds only when it samples with vLLM (the train/inference mismatch: this run samples with transformers).
    empty = [p for p, has in run["panels"].items() if not has]
    assert empty and all(re.search(r"grpo_(kl_bucket|entropy_bucket|rank_|mismatch_|importance_)", p) for p in empty), empty


def test_the_record_has_one_row_per_logged_step_with_trls_values(run):
    train = [h for h in run["history"] if "loss" in h and "train_runtime" not in h]
    evals = {h["step"]: h for h in run["history"] if "eval_loss" in h}
    rows = records(run["dir"] / "steps.csv")
    assert [int(r["step"]) for r in rows] == [h["step"] for h in train] == list(range(1, STEPS + 1))
    for r, h in zip(rows, train):
        for ours, theirs in (("reward", "reward"), ("loss", "loss"), ("kl", "kl"), ("entropy", "entropy"),
                             ("frac_zero_std", "frac_reward_zero_std"), ("reward_correct", "rewards/correct/mean"),
                             ("response_len", "completions/mean_length"), ("grad_norm", "grad_norm")):
            assert num(r[ours]) == pytest.approx(h[theirs], rel=1e-4, abs=1e-9), (r["step"], ours)
        assert r["steps_in_row"] == "1"
        assert (r["sample_acc"] != "") == (h["step"] in evals)
    for step, h in evals.items():
        if step:
            assert num(rows[step - 1]["sample_acc"]) == pytest.approx(h["eval_rewards/correct/mean"])
            assert rows[step - 1]["eval_n"] == str(EVAL_PROMPTS * trl_run.G)
    curve = records(run["dir"] / "reward-vs-step.csv")
    assert [int(r["step"]) for r in curve] == [0, 6, 12] and [r["steps_in_window"] for r in curve] == ["0", "6", "6"]
    assert num(curve[0]["sample_acc"]) == pytest.approx(evals[0]["eval_rewards/correct/mean"])  # the baseline
    summary = json.loads((run["dir"] / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == STEPS and summary["trainer"] == "trl"
    assert summary["metrics_port"] == run["cb"].telemetry.prometheus_port and summary["telemetry_errors"] == 0
    assert "num_tokens" in summary["trl_keys_not_recorded"]
    # run.json: the scales diagnose reads (TRL's own arguments are in trl-args.json; no config.yaml imitated).
    info = runfiles.read_run_info(run["dir"] / "run.json")
    assert not (run["dir"] / "config.yaml").exists()
    # 16 completions a step in groups of G = 4; window as set; the largest reward 1 + 1 (two weights of 1).
    assert (info.scales.group_size, info.scales.prompts_per_step, info.scales.window) == (trl_run.G, 4, 4)
    assert info.scales.reward_weights == {"correct": 1.0, "short": 1.0} and info.scales.max_reward == 2.0
    assert info.scales.max_new_tokens == 6 and info.run_id == "trl" and info.world_size == 1


def test_derived_advantages_are_trls_own(run):
    """TRL writes each step's completions with its advantages: ours, derived from the wrapped rewards with the
    trainer's num_generations and scale_rewards, agree (steps without an evaluation: TRL rewrites the file
    of an evaluated step with the evaluation's completions)."""
    rows = {int(r["step"]): r for r in records(run["dir"] / "steps.csv")}
    for step in (1, 2, 7, 11):
        adv = np.array(pq.read_table(run["out"] / "completions" / f"completions_{step:05d}.parquet")["advantage"])
        assert num(rows[step]["adv_mean"]) == pytest.approx(adv.mean(), abs=1e-5)
        assert num(rows[step]["adv_std"]) == pytest.approx(adv.std(ddof=1), rel=1e-4, abs=1e-6)


def test_diagnose_reads_the_trl_output_dir_and_the_run_directory(run):
    p = subprocess.run(cli("diagnose", str(run["out"]), "--json"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    notes = json.loads(p.stdout)["notes"]
    assert any("completions/*.parquet: 10 steps (1-11) read per completion" in n and "3 written after an evaluation" in n
               for n in notes), notes
    assert "derived: G = 4 from completions/*.parquet (runs of identical prompts)" in notes
    assert not any("eval_reward (auxiliary)" in n for n in notes)  # the evaluation's reward is no component
    p = subprocess.run(cli("diagnose", str(run["dir"]), "--json"), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.mark.slow
def test_a_saturating_reward_stops_trl_early_and_rows_say_what_they_cover(tmp_path, demo_dir):
    """Every group all-correct: reward_saturated after a window of rows (3 here, each the mean of 2 steps,
    logging_steps=2), and stop_on (the default) ends TRL's run there, keeping a checkpoint. Rewards unwrapped:
    the callback reads TRL's logged means alone."""
    cb = SentinelCallback(out_dir=tmp_path / "runs", run_id="sat", telemetry={"prometheus": False}, health={"window": 3})
    trainer = trl_run.trainer(demo_dir, tmp_path / "out", cb, [trl_run.correct_always], max_steps=40, logging_steps=2)
    trainer.train()
    assert trainer.state.global_step == 6
    rows = records(tmp_path / "runs" / "sat" / "steps.csv")
    assert [(r["step"], r["steps_in_row"]) for r in rows] == [("2", "2"), ("4", "2"), ("6", "2")]
    assert "reward_saturated" in rows[-1]["health"].split() and rows[-1]["adv_mean"] == ""  # not measured unwrapped
    summary = json.loads((tmp_path / "runs" / "sat" / "summary.json").read_text())
    assert summary["status"] == "stopped_early" and summary["reason"].startswith("health.stop_on: reward_saturated")
    assert summary["health_conditions"]["reward_saturated"] == 6 and summary["logging_steps"] == 2
    assert (tmp_path / "out" / "checkpoint-6").is_dir()


@pytest.mark.slow
def test_two_processes_make_one_run_and_one_metrics_endpoint(tmp_path, prometheus, demo_dir):
    """torchrun, 2 ranks, gloo on 127.0.0.1: one run directory and one /metrics (rank 0's), the groups that span
    both ranks gathered to it, and its stop taken by both ranks at the same step."""
    query, target, _ = prometheus
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread a rank: two ranks on two cores
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                        "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(REPO / "tests" / "trl_run.py"),
                        str(demo_dir), str(tmp_path / "out"), str(tmp_path / "runs"), str(target)],
                       capture_output=True, text=True, timeout=400, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    # Each rank prints one JSON line; the two share a pipe, so another print (TRL's summary dict) may follow
    # on the same line: read the first JSON object of each.
    decode = json.JSONDecoder().raw_decode
    ranks = sorted((decode(line)[0] for line in p.stdout.splitlines() if line.startswith('{"rank"')), key=lambda r: r["rank"])
    assert [(r["rank"], r["metrics_port"], r["step"]) for r in ranks] == [(0, target, 3), (1, None, 3)]
    assert [d.name for d in (tmp_path / "runs").iterdir()] == ["two"]
    assert [r["step"] for r in records(tmp_path / "runs" / "two" / "steps.csv")] == ["1", "2", "3"]
    summary = json.loads((tmp_path / "runs" / "two" / "summary.json").read_text())
    assert runfiles.read_run_info(tmp_path / "runs" / "two" / "run.json").world_size == summary["world_size"] == 2

    def last(expr: str) -> float:
        return float(query(f"sum(last_over_time({expr}[5m]))")[0]["value"][1])

    assert wait_for(lambda: query("last_over_time(grpo_steps_total[5m])"), 30, 0.2)
    assert last("grpo_steps_total") == 3
    assert last("grpo_completions_total") == 3 * 12  # both ranks' 6 completions a step
    assert len(query("last_over_time(grpo_step[5m])")) == 1


@pytest.mark.slow
def test_the_wheel_exposes_only_grpo_sentinel_and_pins_the_trl_it_is_tested_with(tmp_path):
    src = tmp_path / "src"
    # .venv* too: .ci/run leaves its lowest-versions venv (~6 GB) beside the main one
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv*", ".git", "build", "*.egg-info", "runs",
                                                            "__pycache__", ".pytest_cache", ".ruff_cache"))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"grpo_sentinel", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "grpo_sentinel/integrations/trl.py" in names and "grpo_sentinel/__init__.py" not in names
    assert not any(n.startswith("grpo_sentinel/telemetry/integrations/") for n in names)
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("/METADATA"))).decode()
    reqs = [r for line in meta.splitlines() if line.startswith("Requires-Dist:")
            if (r := Requirement(line.split(":", 1)[1])).marker is not None]  # the extras' requirements
    # What a TRL user installs pins the callback's range, and what CI tests with installs that extra.
    assert [r.specifier for r in reqs if r.name == "trl" and r.marker.evaluate({"extra": "trl"})] == [SUPPORTED]
    assert any(r.name == "grpo-sentinel" and "trl" in r.extras for r in reqs if r.marker.evaluate({"extra": "test"}))
    assert metadata.version("trl") in SUPPORTED  # ... which this environment, the one tested, satisfies


@pytest.mark.slow
def test_importing_the_callback_imports_nothing_of_the_service():
    code = ("import sys; import grpo_sentinel.integrations.trl; "
            "print([m for m in sys.modules if m.startswith('grpo_sentinel.service')])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


# -- what fails before training, and what never stops it ----------------------------------------


@pytest.mark.parametrize("kwargs, message", [
    ({"health": {"stop_on": ["reward_saturate"]}}, "did you mean 'reward_saturated'"),
    ({"telemetry": {"prometheus_prot": 9464}}, "prometheus_prot: unknown key (did you mean 'prometheus_port'?)"),
    ({"traces": {"train_every": 0}}, "train_every: Input should be greater than 0"),
    ({"run_id": "a/b"}, "run_id='a/b': use letters"),
    ({"max_reward": -1}, "max_reward=-1"),
])
def test_bad_options_fail_at_construction(tmp_path, kwargs, message):
    with pytest.raises(SentinelSetupError, match=re.escape(message)):
        SentinelCallback(out_dir=tmp_path, **{"telemetry": {"prometheus": False}, **kwargs})


def test_a_port_in_use_or_an_existing_run_fails_at_construction(tmp_path):
    first = SentinelCallback(out_dir=tmp_path, telemetry={"prometheus_port": 0})
    with pytest.raises(SentinelSetupError, match=r"cannot serve metrics .*telemetry=\{'prometheus_port'"):
        SentinelCallback(out_dir=tmp_path, telemetry={"prometheus_port": first.metrics_port})
    first._otel.close()
    (tmp_path / "taken").mkdir()
    with pytest.raises(SentinelSetupError, match="already exists: pick another run_id"):
        SentinelCallback(out_dir=tmp_path, run_id="taken", telemetry={"prometheus": False})


def test_a_trl_version_outside_the_tested_range_fails_at_construction(monkeypatch, tmp_path):
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "1.15.2" if name == "trl" else real(name))
    with pytest.raises(SentinelSetupError, match=re.escape(f"reads TRL {SUPPORTED} (what its tests run); this "
                                                           "environment has trl 1.15.2")):
        SentinelCallback(out_dir=tmp_path, telemetry={"prometheus": False})


def test_wrap_rewards_refuses_what_it_cannot_record_and_keeps_trls_view(tmp_path):
    with pytest.raises(SentinelSetupError, match=r"reward_funcs\[1\] is a model id \('org/reward-model'\)"):
        SentinelCallback.wrap_rewards([trl_run.correct, "org/reward-model"])
    with pytest.raises(SentinelSetupError, match="two reward functions are named '<lambda>'"):
        SentinelCallback.wrap_rewards([lambda **_: [], lambda **_: []])

    async def judge(completions, **_):
        return [0.5] * len(completions)

    wrapped = SentinelCallback.wrap_rewards([trl_run.correct, judge])
    # TRL names the logged keys after the function and awaits the async ones: both survive the wrapping.
    from trl.trainer.utils import get_callable_name, is_async_callable

    assert [get_callable_name(f) for f in wrapped] == ["correct", "judge"]
    assert [is_async_callable(f) for f in wrapped] == [False, True]
    assert SentinelCallback.wrap_rewards(wrapped) == wrapped  # wrapping twice records once


def test_a_trainer_config_it_cannot_read_fails_before_training(tmp_path):
    from transformers import TrainerControl, TrainerState, TrainingArguments
    from trl import GRPOConfig

    cb = SentinelCallback(out_dir=tmp_path, telemetry={"prometheus": False})
    plain = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    with pytest.raises(SentinelSetupError, match="not TRL's GRPOConfig"):
        cb.on_train_begin(plain, TrainerState(), TrainerControl())
    silent = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], logging_strategy="no")
    with pytest.raises(SentinelSetupError, match="logging_strategy='no'"):
        cb.on_train_begin(silent, TrainerState(), TrainerControl())


@pytest.mark.slow
def test_a_train_that_raised_is_closed_as_failed_and_the_next_one_is_whole(tmp_path, demo_dir):
    """transformers calls no on_train_end when train() raises: the next train() with the same callback
    closes that run as failed, then gets its own /metrics, record and monitor."""
    calls = []

    def correct(prompts, completions, answer, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("grader down")
        return trl_run.correct(prompts, completions, answer)

    cb = SentinelCallback(out_dir=tmp_path / "runs", telemetry={"prometheus_port": 0})
    with pytest.raises(RuntimeError, match="grader down"):
        trl_run.trainer(demo_dir, tmp_path / "out1", cb, [correct], max_steps=4).train()
    trl_run.trainer(demo_dir, tmp_path / "out2", cb, [correct], max_steps=3).train()
    first, second = sorted((tmp_path / "runs").iterdir(), key=lambda p: p.stat().st_mtime_ns)
    summary = json.loads((first / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["step"] == 2 and "raised" in summary["reason"]
    summary = json.loads((second / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["telemetry_errors"] == 0  # its sinks and monitor started
    assert [r["step"] for r in records(second / "steps.csv")] == ["1", "2", "3"]


def test_a_failing_sink_never_stops_training(tmp_path, demo_dir, monkeypatch):
    """The record's disk fails at every row: TRL still trains to the end; the summary counts the failures."""
    from grpo_sentinel.telemetry.record import RunRecord

    def broken(self, stats):
        raise OSError("disk gone")

    monkeypatch.setattr(RunRecord, "on_step", broken)
    cb = SentinelCallback(out_dir=tmp_path / "runs", run_id="broken", telemetry={"prometheus": False})
    trainer = trl_run.trainer(demo_dir, tmp_path / "out", cb, [trl_run.correct], max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2
    summary = json.loads((tmp_path / "runs" / "broken" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["telemetry_errors"] == 2


def test_traces_of_trls_completions_reach_langfuse_linked_from_the_record(tmp_path, demo_dir, monkeypatch):
    """Keys in the environment, a Langfuse-protocol server (tests/langfuse_server.py): TRL's training
    completions, with wrapped rewards, arrive as generations of the run's session, scored, and the
    record names the traces the server received."""
    from langfuse_server import FakeLangfuse

    server = FakeLangfuse("pk-lf-trl", "sk-lf-trl")
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-trl")
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-trl")
    monkeypatch.setenv("LANGFUSE_BASE_URL", server.url)
    try:
        cb = SentinelCallback(out_dir=tmp_path / "runs", run_id="traced", telemetry={"prometheus": False},
                              traces={"train_every": 2})
        trainer = trl_run.trainer(demo_dir, tmp_path / "out", cb, SentinelCallback.wrap_rewards([trl_run.correct]),
                                  max_steps=4)
        trainer.train()
        traces = server.traces()
    finally:
        server.close()
    assert traces, "no trace reached the server"
    assert not server.refused  # spans and scores as the server's contract wants them
    assert all(sp["attributes"]["session.id"] == "traced" for t in traces.values() for sp in t.spans)
    assert {t.name.rsplit(" group", 1)[0] for t in traces.values()} == {"train step 2", "train step 4"}
    gens = [g for t in traces.values() for g in t.generations]
    prompts = {r["prompt"] for r in trl_run.rows(200)}
    assert gens and all(g["input"] in prompts for g in gens)  # TRL's own prompts
    assert all(t.root and t.input in prompts for t in traces.values())  # the trace-level input, from its parentless root
    assert {sc["observationId"] for sc in server.scores.values()} == {g["span_id"] for g in gens}
    listed = [t for r in records(tmp_path / "runs" / "traced" / "steps.csv") for t in r["trace_ids"].split()]
    assert listed and set(listed) <= set(traces)


# -- the mapping (trl_stats), on plain values -----------------------------------------------------


def setup(**kw) -> trl_stats.Setup:
    base = dict(group_size=2, scale_rewards="group", aggregation="sum_then_normalize", names=("correct", "fmt"),
                weights=(1.0, 0.5), ln_vocab=math.log(16), correctness="correct", stop_tokens=frozenset({0}))
    return trl_stats.Setup(**{**base, **kw})


def test_advantages_follow_trls_scaling_rules():
    # Two groups of G = 2. Combined rewards r = correct + 0.5 fmt: group 1 [1.5, 0], group 2 [1, 1].
    per_func = np.array([[1, 1], [0, 0], [1, 0], [1, 0]], dtype=float)
    w = np.array([1.0, 0.5])
    # group: (r - mean) / (unbiased std + 1e-4); group 1 std = 1.5 / sqrt 2 = 1.06066 -> +-0.75 / 1.06076
    assert trl_stats.advantages(per_func, w, 2, "group", "sum_then_normalize") == pytest.approx(
        [0.75 / 1.06076, -0.75 / 1.06076, 0, 0], abs=1e-5)
    # none: r - mean
    assert trl_stats.advantages(per_func, w, 2, "none", "sum_then_normalize") == pytest.approx([0.75, -0.75, 0, 0])
    # batch: divided by the whole batch's std: r = [1.5, 0, 1, 1], mean 0.875, std 0.62915
    assert trl_stats.advantages(per_func, w, 2, "batch", "sum_then_normalize") == pytest.approx(
        [0.75 / 0.62925, -0.75 / 0.62925, 0, 0], abs=1e-5)
    # normalize_then_sum: each function within its group, then the weighted sum over the batch. correct, group 1
    # [1, 0]: +-0.5 / (0.70711 + 1e-4) = +-0.70701; fmt the same; group 2 all equal: 0. Weighted sum 1.5 * 0.70701
    # = +-1.06051; over the batch mean 0, std 0.86590 (+ 1e-4: 0.86600) -> +-1.22460.
    assert trl_stats.advantages(per_func, w, 2, "group", "normalize_then_sum") == pytest.approx(
        [1.22460, -1.22460, 0, 0], abs=1e-4)
    # A completion every function returned None for: excluded from its group, advantage 0.
    per_func[0] = math.nan
    assert trl_stats.advantages(per_func, w, 2, "group", "sum_then_normalize")[:2] == pytest.approx([0, 0])


def test_what_trl_does_not_log_is_unmeasured_never_invented():
    s = setup()
    stats = trl_stats.step_stats(4, {"loss": 0.1, "reward": 0.5, "entropy": float("nan"), "rewards/correct/mean": 0.25,
                                     "frac_reward_zero_std": 0.5}, s, steps_in_row=2)
    assert stats.reward == 0.5 and stats.frac_zero_std == 0.5 and stats.train_acc == 0.25 and stats.steps_in_row == 2
    assert math.isnan(stats.kl) and {"kl", "grad_norm", "adv_mean", "frac_zero_std_correct"} <= stats.unmeasured
    assert "entropy" not in stats.unmeasured  # TRL logged a NaN entropy: an overflow, counted as such
    from grpo_sentinel.telemetry.catalogue import nonfinite_signals

    assert nonfinite_signals(stats) == ["entropy"]
    # Under batch scaling TRL's zero-std flag tests the whole batch: not the fraction of groups.
    batch = trl_stats.step_stats(4, {"loss": 0.1, "frac_reward_zero_std": 1.0}, setup(scale_rewards="batch"), 1)
    assert "frac_zero_std" in batch.unmeasured


def test_samples_give_the_split_and_the_lengths():
    # Two groups of 2: group 1 both right (all-correct, no signal), group 2 both wrong but fmt differs (signal).
    gen = trl_stats.Generation(prompts=["a", "a", "b", "b"], completions=["1", "1", "x", "yy"], answers=["1"] * 2 + ["2"] * 2,
                               lengths=[2, 2, 2, 6], last_tokens=[0, 0, 0, 7],
                               rewards={"correct": [1.0, 1.0, 0.0, 0.0], "fmt": [1.0, 1.0, 1.0, 0.0]})
    x = trl_stats.samples([gen], setup())
    stats = trl_stats.step_stats(1, {"loss": 0.0, "step_time": 2.0}, setup(), 1, x)
    assert stats.frac_zero_std == 0.5 and stats.frac_zero_std_correct == 0.5 and stats.frac_zero_std_wrong == 0
    assert stats.train_acc == 0.5 and stats.response_len_correct == 2 and stats.response_len_wrong == 4
    assert stats.tokens_per_s == 12 / 2.0 and x.truncated.tolist() == [False, False, False, True]
    assert x.prompts == ("a", "b") and x.answers == ("1", "2") and {"kl", "entropy"} <= x.unmeasured


def test_a_completion_the_verifier_gave_none_is_neither_right_nor_wrong():
    # Group 1: one wrong, one unjudged (correct = None), both fmt 1: combined 0.5 and 0.5, no signal, but
    # not all-wrong. Group 2: both right.
    gen = trl_stats.Generation(prompts=["a", "a", "b", "b"], completions=["3", "?", "1", "1"], answers=["2"] * 2 + ["1"] * 2,
                               lengths=[2, 5, 2, 2], last_tokens=[0, 0, 0, 0],
                               rewards={"correct": [0.0, None, 1.0, 1.0], "fmt": [1.0, 1.0, 1.0, 1.0]})
    x = trl_stats.samples([gen], setup())
    stats = trl_stats.step_stats(1, {"loss": 0.0}, setup(), 1, x)
    assert stats.frac_zero_std == 1.0 and stats.frac_zero_std_correct == 0.5 and stats.frac_zero_std_wrong == 0.0
    assert stats.train_acc == 2 / 3 and stats.response_len_wrong == 2 and stats.response_len_correct == 2
