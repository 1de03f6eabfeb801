"""Alert rules and dashboard: promtool-valid, unit-tested, only catalogue metrics, runbook anchors that
exist, one monitoring config (telemetry/monitoring.py) for rules and dashboards. That the committed
files are what the generators write is tests/test_generated.py's."""

import re
import subprocess

import pytest
import yaml

from grpo_sentinel.telemetry import dashboard
from grpo_sentinel.telemetry.catalogue import CATALOGUE, DAEMON
from grpo_sentinel.telemetry.health import rules as rulegen
from grpo_sentinel.telemetry.health.table import TABLE
from helpers import REPO, cli

RULES = REPO / "deploy" / "prometheus" / "grpo-rules.yml"


def test_rules_parse(promtool):
    p = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_rule_unit_tests(promtool):
    p = subprocess.run([promtool, "test", "rules", "tests/grpo-rules.test.yml"], cwd=RULES.parent,
                       capture_output=True, text=True)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr


CATALOGUE_NAMES = {n for m in CATALOGUE for n in m.prometheus_names()} | {d.name for d in DAEMON}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bgrpo[_:][a-z0-9_:]+", expr))


def test_one_alert_per_table_row_with_its_severity_and_words():
    rules = [r for g in rulegen.rules()["groups"] for r in g["rules"] if "alert" in r]
    alerts = {r["alert"]: r for r in rules if "stage" not in r["labels"]}
    # A drift row's warning escalates (detectors._escalate): a second rule of the same alert, critical,
    # its warning's expression and "worse than a window before", held for one window (5m).
    escalated = {r["labels"]["condition"]: r for r in rules if r["labels"].get("stage") == "escalated"}
    assert set(escalated) == {"kl_acceleration", "length_drift", "correctness_drop"}
    for cid, r in escalated.items():
        warning = alerts[rulegen.alert_name(cid)]
        assert (r["alert"], r["labels"]["severity"], r["for"]) == (warning["alert"], "critical", "5m")
        assert warning["expr"] in r["expr"] and ("offset 5m" in r["expr"] or "avg_w_prev" in r["expr"])
    # And a forecast stage (detectors._forecast): critical with the warning, no longer hold, when the signal at
    # its trend reaches the failure level within forecast_windows (7) windows: 7 x 300 s = 2100 s (35m) at the default
    # 5m window.
    forecast = {r["labels"]["condition"]: r for r in rules if r["labels"].get("stage") == "forecast"}
    assert set(forecast) == {"kl_acceleration", "length_drift", "correctness_drop", "entropy_drift"}
    for cid, r in forecast.items():
        warning = alerts[rulegen.alert_name(cid)]
        assert (r["alert"], r["labels"]["severity"], r.get("for")) == (warning["alert"], "critical", warning.get("for"))
        assert warning["expr"] in r["expr"] and ("predict_linear" in r["expr"]) == (cid != "kl_acceleration")
    assert "predict_linear(grpo_truncation_rate[10m], 2100)) >= 0.9" in forecast["length_drift"]["expr"]
    kl_forecast = "clamp_min(grpo:kl_mean:ratio_w, 1) ^ clamp_max(grpo:kl_mean:rising_windows, 7) > 1"
    assert kl_forecast in forecast["kl_acceleration"]["expr"]
    for row in TABLE:
        a = alerts[rulegen.alert_name(row.id)]
        assert a["labels"]["condition"] == row.id
        assert row.severity in a["labels"]["severity"]
        assert (a["annotations"]["cause"], a["annotations"]["action"]) == (row.cause, row.action)
        # A trainer-side row reads the verdict the trainer exports; a PromQL row never does.
        assert ("grpo_health_condition" in a["expr"]) == (row.id in rulegen.TRAINER_SIDE)
    assert {"GRPOTrainingStalled", "GRPOMetricsExportFailing"} <= set(alerts)


def test_rules_cli_writes_a_variant_and_rejects_bad_settings(tmp_path, promtool):
    p = subprocess.run(cli("rules", "--set", "window=10m", "--set", "kl_bound=0.5", "--set", "pending=30s"),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    alerts = {r.get("alert"): r for g in yaml.safe_load(p.stdout)["groups"] for r in g["rules"]}
    assert "grpo:kl_mean:avg_w > 0.5" in alerts["GRPOKLRunaway"]["expr"] and alerts["GRPOKLRunaway"]["for"] == "30s"
    assert "[10m]" in p.stdout and "[5m]" not in p.stdout
    (tmp_path / "r.yml").write_text(p.stdout)
    assert subprocess.run([promtool, "check", "rules", str(tmp_path / "r.yml")], capture_output=True).returncode == 0
    for bad, says in (
        ("klbound=1", "unknown rule setting 'klbound'; known: window"),
        ("window=5x", "not a positive duration"),
        ("window=0", "not a positive duration"),
        ("kl_bound=high", "not a number"),
        ("nonfinite_run=2.5", "not a whole number"),
        ("kl_bound", "NAME=VALUE"),
        ("kl_bound=-1", "kl_bound must be > 0"),
        ("max_reward=0", "max_reward must be > 0"),
        ("saturated=1.5", "in (0, 1]"),
        ("kl_accel=1", "a number > 1"),
        ("kl_bound=nan", "not a number"),
        ("group_by=", "comma-separated label names"),
        ("group_by=job,in stance", "comma-separated label names"),
    ):
        p = subprocess.run(cli("rules", "--set", bad), capture_output=True, text=True)
        assert p.returncode == 2 and says in p.stderr and not p.stdout, (bad, p.stderr)


def test_the_settable_thresholds_are_exactly_those_the_rules_read():
    from dataclasses import fields, replace

    default = rulegen.render()
    changes = {f.name for f in fields(rulegen.Thresholds) if f.name != "window"
               if rulegen.render(rulegen.RuleParams(thresholds=replace(rulegen.Thresholds(), **{
                   f.name: getattr(rulegen.Thresholds(), f.name) * 2}))) != default}
    assert changes == set(rulegen.RULE_THRESHOLDS)


def test_rules_use_only_catalogue_metrics_and_existing_runbook_anchors():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    used = {name for r in rules for name in metric_names(r["expr"])}
    assert used <= CATALOGUE_NAMES | recorded, f"not in the catalogue: {used - CATALOGUE_NAMES - recorded}"
    anchors = set(re.findall(r"^## (\S+)$", (REPO / "docs" / "runbook.md").read_text(), re.M))
    for r in rules:
        if "alert" in r:
            assert {"summary", "description", "runbook_url"} <= set(r["annotations"]), r["alert"]
            anchor = r["annotations"]["runbook_url"].split("#", 1)[1]
            assert "{{" in anchor or anchor in anchors, f"{r['alert']}: no runbook section {anchor!r}"


GRAFANA_VARS = {"$job": "grpo", "$run": "r", "$window": "5m", "$__rate_interval": "1m", "$__range": "1h"}


def grafana_to_promql(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, f"a variable the checks do not know: {expr}"
    return expr


@pytest.mark.parametrize("name,file", [("health", "grpo-health.json"), ("service", "grpo-service.json")])
def test_committed_dashboard_reads_as_a_grafana_dashboard(name, file):
    import json

    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    path = REPO / "grafana" / "dashboards" / file
    # The SDK's Grafana 10.1 model reads it back to the same JSON: nothing outside the schema. (It
    # re-adds the schema's default variable id, which build() drops on purpose.)
    board = json.loads(path.read_text())
    back = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    for v in back["templating"]["list"]:
        v.pop("id")
    assert back == board


def test_dashboard_queries_parse_and_use_only_catalogue_metrics(tmp_path, promtool):
    board = dashboard.build()
    qs = dashboard.queries(board)
    assert len(qs) >= 30
    used = set().union(*(metric_names(e) for _, e in qs))
    assert used <= CATALOGUE_NAMES, f"not in the catalogue: {used - CATALOGUE_NAMES}"
    # promtool parses PromQL in rule files: every query as a recording rule.
    doc = {"groups": [{"name": "dashboard", "rules": [{"record": f"q:{i}", "expr": grafana_to_promql(e)}
                                                      for i, (_, e) in enumerate(qs)]}]}
    (tmp_path / "q.yml").write_text(yaml.safe_dump(doc))
    p = subprocess.run([promtool, "check", "rules", str(tmp_path / "q.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p.get("description") for p in panels), [p["title"] for p in panels if not p.get("description")]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) >= {"datasource", "job", "run", "window", "langfuse_url", "langfuse_project"}
    # The run is the run_id label every series carries; every query selects it (runs on one pod never mix).
    assert variables["run"]["query"] == 'label_values(grpo_step{job=~"$job"}, run_id)'
    assert all('run_id="$run"' in e for _, e in qs), [e for _, e in qs if 'run_id="$run"' not in e]
    links = [link["url"] for p in panels for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])]
    assert links and set(links) == {"${langfuse_url}/project/${langfuse_project}/sessions/${run:percentencode}"}
    kinds = {p["type"] for p in panels}
    assert {"timeseries", "heatmap", "state-timeline", "stat"} <= kinds


def test_service_dashboard_queries_parse_and_use_only_daemon_and_catalogue_metrics(tmp_path, promtool):
    board = dashboard.build_service()
    qs = dashboard.queries(board)
    used = set().union(*(metric_names(e) for _, e in qs))
    assert {"grpo_runs", "grpo_runs_finished_total", "grpo_step", "grpo_health_condition"} <= used <= CATALOGUE_NAMES
    assert any("ALERTS{" in e for _, e in qs)  # alerts firing per run
    vars_ = {"$job": "grpo", "$window": "5m", "$__range": "1h"}
    doc = {
        "groups": [
            {"name": "service", "rules": [{"record": f"q:{i}", "expr": _with(e, vars_)} for i, (_, e) in enumerate(qs)]}
        ]
    }
    (tmp_path / "q.yml").write_text(yaml.safe_dump(doc))
    p = subprocess.run([promtool, "check", "rules", str(tmp_path / "q.yml")], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p.get("description") for p in panels) and len({p["id"] for p in board["panels"]}) == len(board["panels"])
    links = {link["url"] for p in panels for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])}
    links |= {link["url"] for p in panels for o in p.get("fieldConfig", {}).get("overrides", [])
              for prop in o["properties"] if prop["id"] == "links" for link in prop["value"]}
    # Every run links to its own health dashboard and its Langfuse session (session id = run id).
    assert links == {dashboard.RUN_DASHBOARD, dashboard.RUN_GENERATIONS, dashboard.SERIES_DASHBOARD, dashboard.SERIES_GENERATIONS}
    assert all(u.startswith("/d/grpo-health?") for u in links if "langfuse" not in u)
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "job", "window", "langfuse_url", "langfuse_project"}


def _with(expr: str, values: dict[str, str]) -> str:
    for var, value in values.items():
        expr = expr.replace(var, value)
    assert "$" not in expr, expr
    return expr


def test_the_example_prometheus_config_loads_the_rules(promtool):
    p = subprocess.run([promtool, "check", "config", str(RULES.parent / "prometheus.example.yml")],
                       capture_output=True, text=True)
    n = sum(len(g["rules"]) for g in rulegen.rules()["groups"])
    assert p.returncode == 0 and f"{n} rules found" in p.stdout, p.stdout + p.stderr


def test_alerts_link_the_runs_dashboard_and_generations_when_grafana_and_langfuse_are_set(tmp_path, promtool):
    params = rulegen.with_settings(rulegen.RuleParams(), ["grafana=https://grafana.example.com/",
                                                          "langfuse=https://langfuse.example.com/project/p1"])
    (tmp_path / "rules.yml").write_text(rulegen.render(params))
    drift = next(r for r in rulegen.rules(params)["groups"][1]["rules"] if r["alert"] == "GRPOAdvMeanDrift")
    case = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": 'grpo_advantage_mean{job="grpo",instance="10.0.0.7:9464",run_id="run 7"}',
                        "values": "0.05x5",
                    }
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "2m",
                        "alertname": "GRPOAdvMeanDrift",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "condition": "adv_mean_drift",
                                    "job": "grpo",
                                    "instance": "10.0.0.7:9464",
                                    "run_id": "run 7",
                                },
                                "exp_annotations": {
                                    **{
                                        k: v.replace("{{ $labels.instance }}", "10.0.0.7:9464").replace(
                                            "{{ $value }}", "0.05"
                                        )
                                        for k, v in drift["annotations"].items()
                                    },
                                    "dashboard_url": "https://grafana.example.com/d/grpo-health?var-job=grpo&var-run=run+7",
                                    # the run's Langfuse session: the trace exporter's session id is the run id
                                    "generations_url": "https://langfuse.example.com/project/p1/sessions/run+7",
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(case))
    p = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dashboard_url" not in RULES.read_text()  # the default rendering has no Grafana to link
    assert "generations_url" not in RULES.read_text()  # nor a Langfuse


def test_group_by_is_one_setting_used_by_every_rule(tmp_path, promtool):
    """kubernetes-mixin style: the labels every rule aggregates by are RuleParams.group_by (default
    job, instance, run_id), settable with `rules --set group_by=...`; no rule hard-codes them."""
    default = rulegen.render()
    # Only the daemon's own series (one per pod, no run) aggregate without run_id: group_by minus run_id.
    exprs = [r["expr"] for g in yaml.safe_load(default)["groups"] for r in g["rules"]]
    assert all(any(d.name in e for d in DAEMON) for e in exprs if "by (job, instance)" in e)
    assert default.count("by (job, instance, run_id)") > 40
    p = subprocess.run(cli("rules", "--set", "group_by=cluster,job,run_id"), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "by (cluster, job, run_id)" in p.stdout and "instance)" not in p.stdout.replace("by (cluster, job, run_id)", "")
    (tmp_path / "r.yml").write_text(p.stdout)
    assert subprocess.run([promtool, "check", "rules", str(tmp_path / "r.yml")], capture_output=True).returncode == 0
    # Without run_id among them, the dashboard link looks the run up in target_info when it fires.
    params = rulegen.with_settings(rulegen.RuleParams(), ["grafana=https://g", "group_by=job,instance"])
    url = rulegen.rules(params)["groups"][1]["rules"][0]["annotations"]["dashboard_url"]
    assert "target_info" in url and "$labels.run_id" not in url


SELECTOR = 'namespace="ml", cluster=~"eu-.*"'
RAW = re.compile(r"(?<![\w:])(grpo_[a-z0-9_]+|target_info)(?![\w:])(\{[^}]*\})?")


def _unselected(exprs: list[str]) -> list[str]:
    """Every read of an exported series that does not begin with SELECTOR's matchers."""
    return [m.group(0) for e in exprs for m in RAW.finditer(e) if not (m.group(2) or "").startswith("{" + SELECTOR)]


def test_one_monitoring_config_selects_every_series_of_the_rules_and_the_dashboards(tmp_path, promtool):
    """kubernetes-mixin's config.libsonnet: one selector, grouping and window (telemetry/monitoring.py) for the
    Prometheus rules, the Grafana rules and both dashboards; `--set` overrides it for each without a fork."""
    from grpo_sentinel.telemetry import monitoring
    from grpo_sentinel.telemetry.health import rules_grafana

    settings = [f"selector={SELECTOR}", "window=10m", "group_by=namespace,job,instance,run_id"]
    p = subprocess.run(cli("rules", *(a for s in settings for a in ("--set", s))), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    (tmp_path / "r.yml").write_text(p.stdout)
    assert subprocess.run([promtool, "check", "rules", str(tmp_path / "r.yml")], capture_output=True).returncode == 0
    params = rulegen.with_settings(rulegen.RuleParams(), settings)
    rules = [r for g in yaml.safe_load(p.stdout)["groups"] for r in g["rules"]]
    assert rules == [r for g in rulegen.rules(params)["groups"] for r in g["rules"]]
    exprs = [r["expr"] for r in rules]
    grafana = [r["data"][0]["model"]["expr"] for g in rules_grafana.groups(params) for r in g["rules"]]
    m = monitoring.with_settings(monitoring.Monitoring(), settings)
    boards = {name: dashboard.build(m) if name == "health" else dashboard.build_service(m) for name in ("health", "service")}
    panel_exprs = [e for b in boards.values() for _, e in dashboard.queries(b) if "ALERTS" not in e]
    variables = [v["query"] for b in boards.values() for v in b["templating"]["list"] if v["type"] == "query"]
    assert len(exprs) > 60 and len(panel_exprs) > 40 and len(variables) == 3
    assert not _unselected(exprs + grafana + panel_exprs + variables)
    assert _unselected(rulegen.render().splitlines())  # the check sees an unselected read
    assert "[10m]" in p.stdout and "[5m]" not in p.stdout
    for b in boards.values():  # the moving means default to the rules' window
        window = next(v for v in b["templating"]["list"] if v["name"] == "window")
        assert window["query"].split(",")[0] == "10m" and sorted(window["query"].split(",")) == sorted(
            "10m,1m,2m,5m,30m,1h".split(","))
    cmd = subprocess.run(cli("dashboard", "service", *(a for s in settings for a in ("--set", s))),
                         capture_output=True, text=True)
    assert cmd.returncode == 0 and cmd.stdout == dashboard.render("service", m)
    bad = subprocess.run(cli("dashboard", "--set", "selector=namespace=ml"), capture_output=True, text=True)
    assert bad.returncode == 2 and "give PromQL label matchers" in bad.stderr and not bad.stdout


def test_the_panels_said_to_show_a_row_exist_and_say_how_to_read_it():
    """monitoring.PANEL_ROWS is what the dashboard's descriptions and the runbook's "confirm on the dashboard"
    both read: every title there is a panel, every row a table row, written into that panel's description."""
    from grpo_sentinel.telemetry.monitoring import PANEL_ROWS

    panels = [p for p in dashboard.build()["panels"] if p["type"] != "row"]
    rows = {r.id for r in TABLE}
    for title, shown in PANEL_ROWS.items():
        assert set(shown) <= rows, (title, set(shown) - rows)
        for row in shown:
            assert [p for p in panels if p["title"] == title and f"-> {row} (" in p["description"]], (title, row)


def test_a_reader_that_closes_the_pipe_early_ends_it_quietly():
    """`grpo-sentinel rules | head -1` where the reader is gone before the command writes (the order a short output
    meets when `head` has had its lines): exit 0 and nothing on stderr, not a BrokenPipeError traceback."""
    p = subprocess.Popen(cli("rules"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()
    assert p.wait(timeout=60) == 0
    assert p.stderr.read() == b""
