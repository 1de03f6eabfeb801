"""Real components: a real Prometheus scraping a real trainer; a real OTLP/HTTP receiver; a dead collector."""

import csv
import gzip
import json
import os
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from grpo_sentinel.telemetry import dashboard
from grpo_sentinel.telemetry.catalogue import CATALOGUE
from helpers import cli, free_port, new_run, query_range

STEPS = 30


def csv_rows(run_dir: Path) -> list[dict]:
    return list(csv.DictReader((run_dir / "steps.csv").open()))


def test_prometheus_scrapes_every_catalogue_metric_and_agrees_with_the_record(tmp_path, prometheus, demo_dir):
    query, target, web = prometheus
    t0 = time.time()
    p = subprocess.run(cli("train", "--steps", str(STEPS), "--out", str(tmp_path), "--set", "run.run_id=r",
                           "--set", "run.sample_every=10", "--set", f"telemetry.prometheus_port={target}",
                           "--set", "telemetry.linger_s=2"), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = csv_rows(tmp_path / "r")
    # The end says what the run learned, from the step-0 baseline, and what to look at next.
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert (f"held-out accuracy (n=200): {summary['baseline']['sample_acc']:.3f} at step 0 -> "
            f"{float(rows[-1]['sample_acc']):.3f} at step {STEPS}") in p.stdout
    assert f"next: grpo-sentinel diagnose {tmp_path / 'r'} --plot run.png" in p.stdout
    assert p.stdout.strip().splitlines()[-1] == f"run completed at step {STEPS}: {tmp_path / 'r'}"  # last, for scripts
    # Every column of the record carries something on a healthy run, but the two that say what went wrong
    # and the trace links (no Langfuse here).
    assert {k for k in rows[0] if all(r[k] == "" for r in rows)} <= {"skipped", "health", "trace_ids", "eval_trace_id"}

    def last(expr: str) -> float:
        result = query(f"sum(last_over_time({expr}[5m]))")
        assert result, f"no data for {expr}"
        return float(result[0]["value"][1])

    names = set(json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/label/__name__/values"))["data"])
    expected = {n for m in CATALOGUE for n in m.prometheus_names()}
    assert expected <= names, f"in the catalogue but never scraped: {sorted(expected - names)}"
    assert {n for n in names if n.startswith("grpo_")} <= expected, "scraped but not in the catalogue"

    assert last("grpo_step") == STEPS
    assert last("grpo_reward_mean") == pytest.approx(float(rows[-1]["reward"]), abs=1e-5)
    assert last('grpo_sample_acc{mode="sampled"}') == pytest.approx(float(rows[-1]["sample_acc"]))
    assert last('grpo_frac_zero_std{outcome="any"}') == pytest.approx(float(rows[-1]["frac_zero_std"]), abs=1e-5)
    # The per-completion histogram: every completion of every step, so sum / count = mean of the step means
    # (64 valid completions in each step).
    assert last("grpo_reward_count") == STEPS * 64
    mean_reward = sum(float(r["reward"]) for r in rows) / STEPS
    assert last("grpo_reward_sum") / last("grpo_reward_count") == pytest.approx(mean_reward, abs=1e-5)
    assert last("grpo_steps_total") == STEPS
    assert last("grpo_tokens_total") == pytest.approx(sum(float(r["response_len"]) * 64 for r in rows), abs=0.5)
    # The rules are loaded; a healthy run fires none of the pathology rows. reward_saturated is the success
    # row ("stop early, keep the checkpoint"), and the warmed-up demo's training accuracy already runs at
    # 0.85-0.97: whether its time-window mean crosses the threshold depends on which steps the window holds.
    alerts = query("last_over_time(ALERTS[10m])")
    assert [a["metric"]["alertname"] for a in alerts if a["metric"]["condition"] != "reward_saturated"] == []
    # ... and every rule evaluated without error on the real label sets (vector matching, divisions).
    groups = json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/rules"))["data"]["groups"]
    broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
    assert sum(len(g["rules"]) for g in groups) > 40 and not broken, broken
    info = query("last_over_time(target_info[5m])")
    assert info and info[0]["metric"]["grpo_run_id"] == "r" and info[0]["metric"]["service_name"] == "grpo-sentinel"

    # Every dashboard query returns data over the run, as Grafana would ask for it (range queries,
    # the variables resolved the way the dashboard's own variable queries resolve them).
    board = dashboard.build()
    run_var = next(v for v in board["templating"]["list"] if v["name"] == "run")["query"]
    assert run_var == 'label_values(grpo_step{job=~"$job"}, run_id)'  # its values: the run_id label, "r" above
    assert query('count by (run_id) (last_over_time(grpo_step{job="grpo"}[5m]))')[0]["metric"]["run_id"] == "r"
    grafana = {"$job": "grpo", "$run": "r", "$window": "2s", "$__rate_interval": "1s", "$__range": "1m"}
    empty = []
    for title, expr in dashboard.queries(board):
        for var, value in grafana.items():
            expr = expr.replace(var, value)
        if not query_range(web, expr, t0, time.time()):
            empty.append(f"{title}: {expr}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


class OTLPReceiver(BaseHTTPRequestHandler):
    """Decodes the real OTLP/HTTP protobuf payload."""

    received: list = []

    def do_POST(self):
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        self.received.append((self.path, req))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.slow
def test_otlp_receiver_gets_the_same_names_and_values(tmp_path, demo_dir):
    server = HTTPServer(("127.0.0.1", 0), OTLPReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_port}",
               OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    try:
        # /metrics on as at the defaults (any free port): the pushes come from the reader the scrape reads.
        p = subprocess.run(cli("train", "--steps", "12", "--out", str(tmp_path), "--set", "run.run_id=r",
                               "--set", "telemetry.prometheus_port=0", "--set", "telemetry.otlp_export_interval_s=0.5"),
                           capture_output=True, text=True, env=env, timeout=600)
    finally:
        server.shutdown()
    assert p.returncode == 0, p.stderr[-2000:]
    assert OTLPReceiver.received and all(path == "/v1/metrics" for path, _ in OTLPReceiver.received)
    names, last_reward, resource = set(), None, {}
    for _, req in OTLPReceiver.received:
        for rm in req.resource_metrics:
            resource = {a.key: a.value.string_value for a in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    names.add(m.name)
                    if m.name == "grpo.reward.mean":
                        last_reward = m.gauge.data_points[-1].as_double
    assert names == {m.name for m in CATALOGUE}
    assert last_reward == pytest.approx(float(csv_rows(tmp_path / "r")[-1]["reward"]), abs=1e-5)
    assert resource["service.name"] == "grpo-sentinel" and resource["grpo.run_id"] == "r"


@pytest.mark.slow
def test_dead_collector_never_stops_training(tmp_path, demo_dir):
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.trainer import Trainer
    from grpo_sentinel.telemetry.otel import OTelSink

    dead = f"http://127.0.0.1:{free_port()}/v1/metrics"  # nothing listens there
    # Beside a live /metrics, as at the defaults: one reader serves the scrape and pushes to the dead collector.
    sink = OTelSink(("127.0.0.1", 0), OTLPMetricExporter(endpoint=dead, timeout=1), export_interval_s=0.2)
    cfg = load_config(None, ["run.sample_every=10"], **{"run.steps": 20})
    t0 = time.monotonic()
    result = Trainer(cfg, new_run(tmp_path, cfg), sinks=[sink]).run_to_end()
    assert result.status == "completed"
    assert [r["step"] for r in csv_rows(tmp_path / "r")] == [str(i) for i in range(1, 21)]
    assert sink.export_failures["otlp"] > 0
    assert time.monotonic() - t0 < 120  # the exit does not wait out the exporter's retries


@pytest.mark.slow
def test_an_induced_collapse_brings_its_alert(tmp_path, prometheus, demo_dir):
    """The real rules on a real scrape: lr 1e-2 on the tiny model loses every group's signal and runs
    off the reference; the PromQL rows reach pending/firing in /api/v1/alerts while the run is live."""
    query, target, web = prometheus
    proc = subprocess.Popen(cli("train", "--steps", "40", "--out", str(tmp_path), "--set", "run.run_id=bad",
                                "--set", "optim.lr=1e-2", "--set", "run.sample_every=20", "--set", "health.stop_on=[]",
                                "--set", f"telemetry.prometheus_port={target}", "--set", "telemetry.linger_s=3"),
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "stderr.log").open("w"))
    seen: dict[str, str] = {}
    while proc.poll() is None:
        alerts = json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/alerts"))["data"]["alerts"]
        for a in alerts:
            seen[a["labels"]["alertname"]] = a["state"]
        time.sleep(0.2)
    assert proc.returncode == 0, (tmp_path / "stderr.log").read_text()[-2000:]
    print("alerts seen:", seen)
    assert "GRPOSignalVanished" in seen, seen
    assert {"GRPOKLRunaway", "GRPOKLDominant"} & set(seen), seen
    assert {"pending", "firing"} >= set(seen.values())
