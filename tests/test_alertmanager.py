"""The Alertmanager example: valid (`amtool check-config`), and routes every severity our rules
emit to the right receiver (`amtool config routes test`)."""

import subprocess

import yaml

from conftest import REPO
from telemetry.health import rules

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
    assert cfg["route"]["group_by"] == ["job", "instance"]
    for receiver in cfg["receivers"]:
        for kind, configs in receiver.items():
            for c in configs if isinstance(configs, list) else []:
                assert not {"routing_key", "service_key", "api_url"} & set(c), f"{kind}: secrets come from *_file"
