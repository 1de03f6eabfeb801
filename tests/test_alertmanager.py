"""The Alertmanager example: valid (`amtool check-config`), routes every severity our rules emit to
the right receiver (`amtool config routes test`), and, in a real Alertmanager, pages once per run
with the run's warnings inhibited by its critical conditions."""

import json
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import yaml

from grpo_sentinel.telemetry.health import rules
from helpers import REPO, answers, free_port, installed, wait_for

EXAMPLE = REPO / "deploy" / "alertmanager" / "example.yml"


def test_example_config_is_valid(amtool):
    p = subprocess.run([amtool, "check-config", str(EXAMPLE)], capture_output=True, text=True)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


def _route(amtool, labels: dict[str, str]) -> str:
    p = subprocess.run([amtool, "config", "routes", "test", f"--config.file={EXAMPLE}",
                        *(f"{k}={v}" for k, v in labels.items())], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_every_alert_of_the_rules_reaches_the_receiver_its_severity_asks_for(amtool):
    want = {"critical": "oncall", "warning": "chat", "info": "annotate-only"}
    alerts = [r for g in rules.rules()["groups"] for r in g["rules"] if "alert" in r]
    for a in alerts:
        severities = ["critical", "warning"] if "{{" in a["labels"]["severity"] else [a["labels"]["severity"]]
        for sev in severities:  # GRPONonfinite's severity is templated: it can be either
            labels = {"alertname": a["alert"], "severity": sev, "condition": a["labels"]["condition"],
                      "job": "grpo", "instance": "10.0.0.7:9464"}
            assert _route(amtool, labels) == want[sev], a["alert"]
    assert _route(amtool, {"alertname": "SomethingElse"}) == "chat"  # the default route


def test_grouped_by_run_and_no_secret_in_the_file():
    cfg = yaml.safe_load(EXAMPLE.read_text())
    assert cfg["route"]["group_by"] == ["job", "instance", "run_id"]
    assert all(rule["equal"] == ["job", "instance", "run_id"] for rule in cfg["inhibit_rules"])
    for receiver in cfg["receivers"]:
        for kind, configs in receiver.items():
            for c in configs if isinstance(configs, list) else []:
                assert not {"routing_key", "service_key", "api_url"} & set(c), f"{kind}: secrets come from *_file"


class Webhook(BaseHTTPRequestHandler):
    received: list = []  # (receiver path, payload)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append((self.path.strip("/"), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _alert(name: str, run: str, instance: str = "10.0.0.7:9464") -> dict:
    """An alert as Prometheus would send it: the labels and annotations of our rule, for one run."""
    rule = next(r for g in rules.rules()["groups"] for r in g["rules"] if r.get("alert") == name)
    labels = {**rule["labels"], "alertname": name, "job": "grpo", "instance": instance, "run_id": run}
    return {"labels": labels, "annotations": {k: v.replace("{{ $labels.instance }}", instance)
                                              for k, v in rule["annotations"].items()}}


def test_a_real_alertmanager_pages_once_per_run_and_inhibits_its_warnings(tmp_path):
    """The example's routes and inhibitions in a real Alertmanager; only the receivers are swapped
    for local webhooks and the group waits shortened. Runs a and b ran one after the other on the same
    trainer (same job and instance): run a collapses (two criticals and a warning), run b only lost its
    signal (a warning), which a's criticals must not inhibit."""
    binary = installed("prometheus-alertmanager", "prometheus-alertmanager")  # Debian names the binary so
    Webhook.received = []
    server = HTTPServer(("127.0.0.1", 0), Webhook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}"
    cfg = yaml.safe_load(EXAMPLE.read_text())
    cfg["route"].update(group_wait="1s", group_interval="1s")
    cfg["receivers"] = [{"name": r["name"], "webhook_configs": [{"url": f"{hook}/{r['name']}"}]} for r in cfg["receivers"]]
    (tmp_path / "am.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        api = f"http://127.0.0.1:{port}/api/v2"
        assert wait_for(lambda: answers(f"{api}/status"), 30, 0.1), "alertmanager did not start"
        alerts = [_alert("GRPOKLRunaway", "a"), _alert("GRPOKLDominant", "a"), _alert("GRPOSignalVanished", "a"),
                  _alert("GRPOMetricsExportFailing", "a"), _alert("GRPOSignalVanished", "b")]
        req = urllib.request.Request(f"{api}/alerts", json.dumps(alerts).encode(), {"Content-Type": "application/json"})
        urllib.request.urlopen(req)
        assert wait_for(lambda: len(Webhook.received) >= 3, 30, 0.1), Webhook.received
        time.sleep(2)  # two more group intervals: nothing else may arrive
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        server.shutdown()
    sent = sorted((path, body["groupLabels"]["run_id"], sorted(a["labels"]["alertname"] for a in body["alerts"]))
                  for path, body in Webhook.received)
    # One notification per run and receiver; run a's health warning is inhibited by its critical
    # conditions, its operational warning is not.
    assert sent == [("chat", "a", ["GRPOMetricsExportFailing"]), ("chat", "b", ["GRPOSignalVanished"]),
                    ("oncall", "a", ["GRPOKLDominant", "GRPOKLRunaway"])], sent
    first = next(body for path, body in Webhook.received if path == "oncall")["alerts"][0]["annotations"]
    assert first["runbook_url"].startswith("docs/runbook.md#") and first["action"]
