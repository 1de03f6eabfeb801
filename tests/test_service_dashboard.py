"""The service dashboard (grafana/dashboards/grpo-service.json) on a real daemon: a real Prometheus
scrapes a real `grpo-sentinel serve` training two runs, one that completes and one that dies
(GRPORunFailed fires), and every query of the dashboard returns data, as Grafana asks for it (range
queries, its variables resolved as its own variable queries resolve them). The Grafana-managed
rules' queries run on the same series without error."""

import json
import os
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from grpo_sentinel.telemetry import dashboard
from grpo_sentinel.telemetry.health import rules_grafana
from helpers import REPO, Daemon, query_range, wait_for

pytestmark = pytest.mark.slow  # the second tier (README, Tests)


def crash_at_step_8(completion, answer, prompt):
    """A reward that kills its process in its eighth step (64 calls a step): the run's series were up long
    enough for several scrapes (a run that dies in its third step can be gone between two)."""
    marker = Path(os.environ["CRASH_MARKER"])
    calls = int(marker.read_text() or 0) + 1 if marker.exists() else 1
    marker.write_text(str(calls))
    if calls > 7 * 64:
        os.kill(os.getpid(), signal.SIGKILL)
    return 1.0 if completion.strip() == answer else 0.0


def test_every_service_query_returns_data_from_a_daemon_training_two_runs(prometheus, tmp_path, demo_dir):
    query, target, web = prometheus
    t0 = time.time()
    d = Daemon(tmp_path / "state", "--reward-module", "test_service_dashboard", port=target,
               env={"CRASH_MARKER": str(tmp_path / "calls"), "PYTHONPATH": str(REPO / "tests")})
    try:
        d.ready()
        # linger: a short run ends within a scrape of its last step; a scrape must see it.
        for run in ({"run": {"steps": 6, "run_id": "ok", "sample_every": 6}, "data": {"eval_size": 20},
                     "telemetry": {"linger_s": 1}},
                    {"run": {"steps": 12, "run_id": "dies", "sample_every": 6}, "data": {"eval_size": 20},
                     "rewards": [{"name": "test_service_dashboard:crash_at_step_8"}]}):
            status, body = d.call("POST", "/v1/runs", run)
            assert status == 201, body
        d.wait_status("dies", {"failed"})
        # Firing, and on the range queries' grid (a step of 0.5 s): the run that died pages.
        assert wait_for(lambda: query_range(web, 'ALERTS{alertname="GRPORunFailed", alertstate="firing"}', t0, time.time()),
                        30, 0.2), "no GRPORunFailed"
        end = time.time()

        board = dashboard.build_service()
        job_var = next(v for v in board["templating"]["list"] if v["name"] == "job")["query"]
        assert job_var == "label_values(grpo_runs, job)"
        assert [r["metric"]["job"] for r in query("count by (job) (grpo_runs)")] == ["grpo"]  # its one value
        span = f"{int(end - t0) + 1}s"
        grafana = {"$job": "grpo", "$window": "2s", "$__range": span}
        results, empty = {}, []
        for title, expr in dashboard.queries(board):
            for var, value in grafana.items():
                expr = expr.replace(var, value)
            assert "$" not in expr, expr
            results[title] = query_range(web, expr, t0, end)
            if not results[title]:
                empty.append(f"{title}: {expr}")
        assert not empty, "service dashboard queries without data:\n" + "\n".join(empty)

        def last(title: str) -> dict[str, float]:
            return {json.dumps(r["metric"], sort_keys=True): float(r["values"][-1][1]) for r in results[title]}

        def seen(title: str, label: str) -> set[str]:
            return {r["metric"].get(label, "") for r in results[title]}

        by_status = {json.loads(k)["status"]: v for k, v in last("Runs by status").items()}
        assert by_status["completed"] == 1 and by_status["failed"] == 1 and by_status["queued"] == 0
        assert max(float(v) for r in results["Queued"] for _, v in r["values"]) >= 1  # "dies" waited for "ok"
        assert seen("Step of each run", "run_id") == {"ok", "dies"} == seen("Runs", "run_id")
        assert max(float(v) for r in results["Step of each run"] if r["metric"]["run_id"] == "ok" for _, v in r["values"]) == 6
        assert seen("Health of each run", "run_id") == {"ok", "dies"}
        assert "GRPORunFailed" in seen("Alerts firing", "alertname")
        assert {json.loads(k)["status"]: v for k, v in last("Failed, halted, preempted").items()}["failed"] >= 1

        # The Grafana-managed rules' queries (recorded series written out) evaluate on the real series.
        for _, rule in ((g, r) for g in rules_grafana.provisioning(rules_grafana.rulegen.RuleParams(window=2, pending=1))
                        ["groups"] for r in g["rules"]):
            url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": rule["data"][0]["model"]["expr"]})
            assert json.load(urllib.request.urlopen(url))["status"] == "success", rule["title"]
    finally:
        d.stop(signal.SIGKILL)
