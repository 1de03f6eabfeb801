"""The trainer daemon as a real process: its HTTP API on 127.0.0.1, a queue that survives SIGKILL,
graceful SIGTERM, failed runs that do not take the service down, and the OpenAPI document."""

import csv
import json
import os
import random
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, Daemon, cli, free_port, query_range, steps_of, wait_for

RUN = {"run": {"steps": 12, "sample_every": 6, "checkpoint_every": 2, "eval_seed": 7}, "data": {"eval_size": 40}}


def test_the_api_queues_runs_validates_every_field_and_serves_record_and_report(daemons, demo_dir):
    d = daemons().ready()
    assert d.call("GET", "/healthz") == (200, {"status": "ok"})
    # Bad input: malformed JSON, an unknown key, a wrong type, each a 422 naming the field.
    code, body = d.call("POST", "/v1/runs", raw=b"{not json")
    assert code == 422
    code, body = d.call("POST", "/v1/runs", {"grpo": {"group_sise": 8}, "optim": {"lr": "fast"}})
    assert code == 422 and "grpo.group_sise: unknown key (did you mean 'group_size'?)" in body["message"]
    assert "optim.lr" in body["message"] and {tuple(e["loc"]) for e in body["detail"]} == {
        ("grpo", "group_sise"),
        ("optim", "lr"),
    }
    assert d.call("POST", "/v1/runs", {"run": {"run_id": "../escape"}})[0] == 422  # a run id is a directory name
    # Two runs queue and run one after the other; a third, still queued, is removed by stop.
    assert d.call("POST", "/v1/runs", {**RUN, "run": {**RUN["run"], "run_id": "a"}}) == (201, {"id": "a", "status": "queued"})
    assert d.call("POST", "/v1/runs", {"run": {"steps": 2, "run_id": "b"}, "data": {"eval_size": 20}})[0] == 201
    assert d.call("POST", "/v1/runs", {"run": {"run_id": "c"}})[0] == 201
    assert d.call("POST", "/v1/runs", {"run": {"run_id": "c"}})[0] == 409
    assert d.call("POST", "/v1/runs/c/stop") == (200, {"id": "c", "status": "removed"})
    assert d.call("GET", "/v1/runs/c")[0] == 404 and not (d.state / "runs" / "c").exists()
    code, runs = d.call("GET", "/v1/runs")
    assert [r["id"] for r in runs] == ["a", "b"]
    running = d.wait_status("a", {"running"})
    a = d.wait_status("a", {"completed"})
    assert a["step"] == 12 and a["baseline"]["n"] == 40 and a["last_eval"] is not None
    assert a["metrics"]["step"] == 12 and "reward" in a["metrics"] and a["conditions"] == []
    assert [e["event"] for e in a["events"]][:2] == ["created", "started"] and running["attempt"] == 1
    code, text = d.call("GET", "/v1/runs/a/record")
    assert code == 200 and [r["step"] for r in csv.DictReader(text.splitlines())] == [str(s) for s in range(1, 13)]
    code, text = d.call("GET", "/v1/runs/a/record?file=reward-vs-step")
    assert [r["step"] for r in csv.DictReader(text.splitlines())] == ["0", "6", "12"]
    code, text = d.call("GET", "/v1/runs/a/report")
    assert code == 200 and text.startswith("# Monitoring report") and "## Verdicts" in text
    assert d.wait_status("b", {"completed"})["step"] == 2

    def counted() -> bool:  # the summary says completed just before the training process exits
        metrics = urllib.request.urlopen(d.url + "/metrics").read().decode()
        return 'grpo_runs{status="completed"} 2.0' in metrics and 'grpo_runs_finished_total{status="completed"} 2.0' in metrics
    assert wait_for(counted, 60, 0.1)


def ended(run_dir: Path) -> list[str]:
    return [e["status"] for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines())
            if e["event"] == "ended"]


@pytest.mark.slow
def test_the_running_run_stops_through_the_api_and_metrics_carry_it(daemons, demo_dir):
    """A stop is `stopped` everywhere (summary, events, `runs follow`), whenever it lands: at the instant the
    run's own process says `running` (model loaded, baseline not yet measured), and between steps."""
    d = daemons().ready()
    d.call("POST", "/v1/runs", {**RUN, "run": {**RUN["run"], "steps": 200, "run_id": "early"}})
    d.call("POST", "/v1/runs", {**RUN, "run": {**RUN["run"], "steps": 200, "run_id": "long"}})
    early = d.state / "runs" / "early"
    assert wait_for(lambda: '"running"' in (early / "summary.json").read_text(errors="replace"), 120, 0.002)
    assert d.call("POST", "/v1/runs/early/stop") == (200, {"id": "early", "status": "stopping"})
    assert d.wait_status("early", {"stopped", "preempted", "completed", "failed"})["status"] == "stopped"
    assert ended(early) == ["stopped"], d.output()
    follow = subprocess.run(cli("runs", "follow", "early", "--url", d.url), capture_output=True, text=True, timeout=60)
    assert follow.returncode == 75 and "run stopped at step" in follow.stdout and "preempted" not in follow.stdout
    assert "run early: stopping through the API" in d.output()
    assert wait_for(lambda: len(steps_of(d.state / "runs" / "long" / "steps.csv")) >= 2, 600, 0.1)
    metrics = urllib.request.urlopen(d.url + "/metrics").read().decode()
    assert 'grpo_step{' in metrics and 'run_id="long"' in metrics  # the run's own series, through the daemon
    assert d.call("POST", "/v1/runs/long/stop") == (200, {"id": "long", "status": "stopping"})
    r = d.wait_status("long", {"stopped"})
    assert ended(d.state / "runs" / "long") == ["stopped"]
    done = len(steps_of(d.state / "runs" / "long" / "steps.csv"))
    assert r["step"] == done and (d.state / "runs" / "long" / "checkpoints" / f"step-{done:08d}").is_dir()
    metrics = urllib.request.urlopen(d.url + "/metrics").read().decode()
    assert "grpo_step{" not in metrics  # an idle daemon serves no step series: no stall alert between runs


def crash_at_step_3(completion, answer, prompt):
    """A reward that kills its process on the third step's first call (a native crash, an OOM kill)."""
    marker = Path(os.environ["CRASH_MARKER"])
    marker.write_text(str(int(marker.read_text() or 0) + 1) if marker.exists() else "1")
    if int(marker.read_text()) > 2 * 64:
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0 if completion.strip() == answer else 0.0


@pytest.mark.slow
def test_a_run_that_dies_is_failed_with_its_error_and_the_next_one_runs(daemons, tmp_path, demo_dir):
    d = daemons("--reward-module", "test_daemon",
                env={"CRASH_MARKER": str(tmp_path / "calls"), "PYTHONPATH": str(REPO / "tests")}).ready()
    d.call("POST", "/v1/runs", {**RUN, "run": {**RUN["run"], "run_id": "dies"},
                                "rewards": [{"name": "test_daemon:crash_at_step_3"}]})
    d.call("POST", "/v1/runs", {"run": {"steps": 2, "run_id": "next"}, "data": {"eval_size": 20}})
    failed = d.wait_status("dies", {"failed"})
    assert failed["error"] == "the training process was killed by SIGKILL (out of memory?)"
    assert d.wait_status("next", {"completed"})["step"] == 2
    assert d.proc.poll() is None


@pytest.mark.slow
def test_sigkill_the_daemon_again_and_again_and_every_step_is_recorded_exactly_once(daemons, tmp_path, demo_dir):
    reference = tmp_path / "ref"
    flags = [x for k, v in {"run.steps": 12, "run.sample_every": 6, "run.checkpoint_every": 2, "run.eval_seed": 7,
                            "data.eval_size": 40, "telemetry.prometheus": "false"}.items() for x in ("--set", f"{k}={v}")]
    ref = subprocess.run(cli("train", "--out", str(reference), "--set", "run.run_id=r", *flags), capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    kills = 0
    d = daemons().ready()
    d.call("POST", "/v1/runs", {**RUN, "run": {**RUN["run"], "run_id": "r"}})
    record = d.state / "runs" / "r" / "steps.csv"
    for target in sorted(random.Random().sample(range(2, 11), 3)):
        assert wait_for(lambda: len(steps_of(record)) >= target or d.proc.poll() is not None, 600, 0.02)
        if len(steps_of(record)) >= 12:
            break
        d.stop(signal.SIGKILL)  # the whole pod dies: the training process with it
        kills += 1
        d = daemons().ready()  # restarts resume the interrupted run first
    r = d.wait_status("r", {"completed"})
    assert kills >= 2 and r["attempt"] == kills + 1
    got, want = steps_of(record), steps_of(reference / "r" / "steps.csv")
    assert [row["step"] for row in got] == [str(s) for s in range(1, 13)]  # every step exactly once
    for key in ("reward", "kl", "loss", "sample_acc"):
        assert [row[key] for row in got] == [row[key] for row in want], key  # as if never interrupted


@pytest.mark.slow
def test_sigterm_checkpoints_the_run_and_exits_0_within_the_grace_and_the_next_start_resumes(daemons, demo_dir):
    d = daemons("--grace-s", "20").ready()
    d.call("POST", "/v1/runs", {**RUN, "run": {**RUN["run"], "steps": 200, "run_id": "g", "checkpoint_every": 50}})
    record = d.state / "runs" / "g" / "steps.csv"
    assert wait_for(lambda: len(steps_of(record)) >= 3, 600, 0.05)
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0
    took = time.monotonic() - t0
    assert took < 20, took
    done = len(steps_of(record))
    summary = json.loads((d.state / "runs" / "g" / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["step"] == done  # a checkpoint at the step boundary
    assert (d.state / "runs" / "g" / "checkpoints" / f"step-{done:08d}").is_dir()
    d = daemons().ready()
    assert wait_for(lambda: len(steps_of(record)) > done, 600, 0.1)
    assert d.run("g")["attempt"] == 2 and [r["step"] for r in steps_of(record)][:done + 1] == [str(s) for s in range(1, done + 2)]


@pytest.mark.slow
def test_beyond_loopback_a_token_is_required(daemons, tmp_path, demo_dir):
    refused = subprocess.run(cli("serve", "--listen", f"0.0.0.0:{free_port()}", "--state-dir", str(tmp_path / "s")),
                             capture_output=True, text=True, timeout=60, env={**os.environ, "GRPO_SENTINEL_API_TOKEN": ""})
    assert refused.returncode == 2 and "set GRPO_SENTINEL_API_TOKEN" in refused.stderr
    # A reward function of the user's (imported by the run's process) that writes down what it can see.
    (tmp_path / "envprobe.py").write_text("import os, pathlib\n\ndef reward(completion, answer, prompt):\n"
                                          "    pathlib.Path(os.environ['PROBE']).write_text(os.environ.get("
                                          "'GRPO_SENTINEL_API_TOKEN', '<absent>'))\n    return 0.0\n")
    d = daemons(
        "--reward-module",
        "envprobe",
        host="0.0.0.0",
        env={"GRPO_SENTINEL_API_TOKEN": "s3cret", "PYTHONPATH": str(tmp_path), "PROBE": str(tmp_path / "probe.txt")},
    ).ready()
    assert d.call("GET", "/v1/runs")[0] == 401
    assert d.call("GET", "/v1/runs", token="wrong")[0] == 401
    assert d.call("GET", "/v1/runs", token="s3cret") == (200, [])
    assert d.call("GET", "/healthz")[0] == 200 and d.call("GET", "/readyz")[0] == 200  # probes stay open
    run = {"run": {"steps": 1, "run_id": "t"}, "data": {"eval_size": 20},
           "rewards": [{"name": "correct"}, {"name": "envprobe:reward", "weight": 0}]}
    assert d.call("POST", "/v1/runs", run, token="s3cret")[0] == 201
    assert wait_for(lambda: d.call("GET", "/v1/runs/t", token="s3cret")[1].get("status") == "completed", 600, 0.2)
    assert (tmp_path / "probe.txt").read_text() == "<absent>"  # the token is the daemon's, never the run's
    assert "s3cret" not in d.output()


@pytest.mark.slow
def test_a_corrupt_queue_is_reported_and_no_run_is_lost(daemons, demo_dir):
    d = daemons().ready()
    d.call("POST", "/v1/runs", {"run": {"steps": 1, "run_id": "x"}, "data": {"eval_size": 20}})
    d.wait_status("x", {"completed"})
    d.stop()
    (d.state / "queue.json").write_text('{"version": 1, "order": ["x"')  # half-written
    d = daemons().ready()
    assert [r["id"] for r in d.call("GET", "/v1/runs")[1]] == ["x"]
    assert "is corrupt" in d.output() and list(d.state.glob("queue.json.corrupt-*"))


def test_the_openapi_document_takes_the_train_config():
    doc = json.loads((REPO / "docs" / "openapi.json").read_text())  # current: tests/test_generated.py
    assert "Config" in doc["components"]["schemas"]  # the body of POST /v1/runs is the train config


@pytest.mark.slow
def test_a_real_prometheus_keeps_two_consecutive_runs_apart_and_an_idle_daemon_never_stalls(prometheus, tmp_path, demo_dir):
    """The daemon's /metrics is the pod's one scrape target: across two runs one after the other, every
    run's series carry its own run_id, the rules evaluate per run, and between and after the runs no
    series says a step is overdue, so GRPOTrainingStalled cannot fire on an idle daemon."""
    query, target, web = prometheus
    t0 = time.time()
    d = Daemon(tmp_path / "state", port=target)  # on the port the Prometheus scrapes
    try:
        d.ready()
        for run_id in ("first", "second"):
            # linger: a 25-step demo run ends within one scrape of its last steps; a scrape must see step 25.
            d.call("POST", "/v1/runs", {"run": {"steps": 25, "run_id": run_id, "sample_every": 25}, "data": {"eval_size": 20},
                                        "telemetry": {"linger_s": 1}})
        d.wait_status("second", {"completed"})
        assert wait_for(lambda: not query('count(grpo_step{run_id="second"} offset 1s)') == [], 30, 0.2)
        time.sleep(1)  # a few idle scrapes after the last run
        end = time.time()
        per_run = query_range(web, "max by (run_id) (grpo_step)", t0, end)
        assert {r["metric"]["run_id"]: max(float(v) for _, v in r["values"]) for r in per_run} == {"first": 25, "second": 25}
        # A window mean never spans both runs: each run's recording rule is its own series.
        windows = query_range(web, "grpo:reward_mean:avg_w", t0, end)
        assert {r["metric"].get("run_id") for r in windows} == {"first", "second"}
        stalled = query_range(web, 'ALERTS{alertname="GRPOTrainingStalled"}', t0, end)
        assert stalled == []
        assert query("grpo_step") == []  # idle now: no run series at all
        groups = json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/rules"))["data"]["groups"]
        assert all(r["health"] == "ok" for g in groups for r in g["rules"]), [r for g in groups for r in g["rules"]
                                                                             if r["health"] != "ok"][:3]
    finally:
        d.stop(signal.SIGKILL)
