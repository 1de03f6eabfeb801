"""The Grafana-managed alert rules (telemetry/health/rules_grafana.py) and the Grafana provisioning
examples (deploy/grafana/): every rule round-trips through
grafana-foundation-sdk's models unchanged, every rule agrees with its Prometheus rule (text,
threshold, labels, annotations, `for:`), fires exactly when it does on every scenario of the
diagnosis zoo (promtool, the Grafana evaluation written as PromQL), and every provisioning file
holds only the fields Grafana's provisioning types read, with the values they accept.

Grafana's file-provisioning contract is read from grafana/grafana's source, main branch, under
pkg/services/provisioning/: alerting/rules_types.go at 0085cf86 (AlertRuleGroupV1, AlertRuleV1,
QueryV1), alerting/contact_point_types.go at 01b1f535 (ContactPointV1, ReceiverV1: a receiver
without settings is refused), alerting/notification_policy_types.go at 031be638 (a
definition.Route: receiver, group_by, object_matchers, routes, continue, group_wait,
group_interval, repeat_interval, mute_time_intervals), alerting/mute_times_types.go at 0aff354e
(an Alertmanager MuteTimeInterval), alerting/types.go at 10a47ba6 (the file's top-level keys) and
values/values.go at 03d9862a (labels and contact point settings are env-interpolated; `$$` is a
literal `$`). Grafana decodes the YAML without rejecting unknown fields; the checks here do reject
them, so that a misspelt field fails here instead of vanishing there.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml
from grafana_foundation_sdk.cog import runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import alerting as am
from grafana_foundation_sdk.models import expr as em
from grafana_foundation_sdk.models import prometheus as pm
from test_rules_agreement import RUNS_A_GROUP, STEP_S, one_scrape, promtool_case

import zoo
from grpo_sentinel.telemetry.health import rules as rulegen
from grpo_sentinel.telemetry.health import rules_grafana as rg
from grpo_sentinel.telemetry.health.thresholds import Thresholds
from helpers import REPO, cli

FOLDER = REPO / "deploy" / "grafana"
COMMITTED = FOLDER / "grpo-alert-rules.yaml"
PROM_DURATION = re.compile(r"^(\d+[smhdwy])+$|^0$")  # prometheus/common model.ParseDuration (ms left out)


def grafana_rules(p=rulegen.RuleParams(), g=rg.GrafanaParams()) -> list[tuple[dict, dict]]:
    """(group, rule) of every Grafana rule."""
    return [(grp, r) for grp in rg.provisioning(p, g)["groups"] for r in grp["rules"]]


def prometheus_alerts(p=rulegen.RuleParams()) -> dict[str, dict]:
    """By Grafana's title: the alert, and a drift row's escalated stage as '<alert> escalated'."""
    return {r["alert"] + (f" {r['labels']['stage']}" if "stage" in r["labels"] else ""): r
            for g in rulegen.rules(p)["groups"] for r in g["rules"] if "alert" in r}


def as_prometheus(text: str) -> str:
    """A Grafana template or label as Prometheus writes it."""
    return text.replace("$$", "$").replace(f"$values.{rg.REDUCED}.Value", "$value")


def test_the_cli_prints_them_with_the_same_settings():
    p = subprocess.run(cli("rules", "--format", "grafana", "--set", "kl_bound=0.5", "--set", "window=10m",
                           "--set", "datasource=mimir", "--set", "folder=ML training"), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    want = rg.provisioning(rulegen.with_settings(rulegen.RuleParams(), ["kl_bound=0.5", "window=10m"]),
                           rg.GrafanaParams(datasource="mimir", folder="ML training"))
    assert yaml.safe_load(p.stdout) == want
    runaway = next(r for _, r in grafana_rules(rulegen.RuleParams(window=600)) if r["title"] == "GRPOKLRunaway")
    assert "[10m]" in runaway["data"][0]["model"]["expr"]
    bad = subprocess.run(cli("rules", "--set", "folder=ML"), capture_output=True, text=True)
    assert bad.returncode == 2 and "folder=ML: Grafana's settings need --format grafana" in bad.stderr and not bad.stdout
    bad = subprocess.run(cli("rules", "--format", "grafana", "--set", "foldr=ML"), capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown rule setting 'foldr'" in bad.stderr and "also datasource, folder" in bad.stderr
    bad = subprocess.run(cli("rules", "--format", "grafana", "--set", "uid_prefix=has space"), capture_output=True, text=True)
    assert bad.returncode == 2 and "uid_prefix='has space'" in bad.stderr and not bad.stdout


# --- the SDK's models ---------------------------------------------------------------------------------

def test_every_rule_round_trips_through_the_sdks_models_unchanged():
    # The SDK's decoders of the two query kinds (Prometheus, server-side expressions); not its panel
    # plugins, which would add their defaults to every dashboard decoded after this test.
    runtime.register_dataquery_variant(pm.variant_config())
    runtime.register_dataquery_variant(em.variant_config())
    for group, rule in grafana_rules():
        api = {**rule, "folderUID": "", "orgID": group["orgId"], "ruleGroup": group["name"]}  # the SDK's (API) shape
        model = am.Rule.from_json(api)
        # Every step decodes to its typed model, not the SDK's bag for unknown queries.
        kinds = [type(q.model) for q in model.data]
        assert kinds[0] is pm.Dataquery and kinds[1] is em.TypeReduce, kinds
        assert kinds[2] in (em.TypeThreshold, em.TypeMath), kinds
        assert json.loads(json.dumps(model, cls=JSONEncoder)) == api, rule["title"]


# --- agreement with the Prometheus rules ------------------------------------------------------------------

def _threshold(rule: dict) -> tuple[str, float] | None:
    c = rule["data"][2]["model"]
    if c["type"] != "threshold":
        return None
    (cond,) = c["conditions"]
    return cond["evaluator"]["type"], cond["evaluator"]["params"][0]


@pytest.mark.parametrize("settings", [[], ["kl_bound=0.5", "window=10m", "pending=5m", "max_reward=2",
                                           "grafana=https://grafana.example.com", "langfuse=https://lf.example.com/project/p"]],
                         ids=["defaults", "settings"])
def test_each_grafana_rule_is_its_prometheus_rule(settings):
    p = rulegen.with_settings(rulegen.RuleParams(), settings)
    prom = prometheus_alerts(p)
    records = {r["record"]: r["expr"] for g in rulegen.rules(p)["groups"] for r in g["rules"] if "record" in r}
    got = grafana_rules(p)
    assert [r["title"] for _, r in got] == list(prom)  # one Grafana rule per Prometheus alert, in order
    thresholds = 0
    for group, rule in got:
        want = prom[rule["title"]]
        assert {k: as_prometheus(v) for k, v in rule["labels"].items()} == want["labels"]
        assert {k: as_prometheus(v) for k, v in rule["annotations"].items()} == want["annotations"]
        assert rule["for"] == want.get("for", "0s")
        query = rule["data"][0]["model"]["expr"]
        found = _threshold(rule)
        if found is None:  # the whole PromQL: the same text, the recorded series written out
            assert query == rg.inline(want["expr"], records)
            continue
        thresholds += 1
        op = {v: k for k, v in rg.THRESHOLD.items()}[found[0]]
        # The Prometheus expression is the query with its first comparison put back.
        assert rg.inline(rg.split(want["expr"])[0], records) == query
        assert re.search(rf"{re.escape(op)} {found[1]:g}(\s|$)", want["expr"]), (rule["title"], found)
        assert want["expr"].replace(f" {op} {found[1]:g}", "", 1) == rg.split(want["expr"])[0]
    # The thresholds are the settings' (golden: the values set above, or the detectors' defaults).
    by_title = {r["title"]: _threshold(r) for _, r in got}
    assert by_title["GRPORewardSaturated"] == ("gte", p.thresholds.saturated)
    assert by_title["GRPOKLRunaway"] == ("gt", 0.5 if settings else 1.0) == ("gt", p.thresholds.kl_bound)
    assert by_title["GRPOTrainingStalled"] == ("gt", 900)
    assert by_title["GRPOLossSpike"] is None  # a trainer-side row: its verdict, an `or` of two readings
    assert thresholds >= 10
    assert all(r["labels"]["condition"] for _, r in got)
    assert len({r["uid"] for _, r in got}) == len(got) and all(len(r["uid"]) <= 40 for _, r in got)


def test_the_split_and_the_written_out_series_are_exact():
    assert rg.split("max by (a) (x) > 0.5\nand y") == ("max by (a) (x)\nand y", ">", "0.5")
    assert rg.split("(\n  x >= 2 and z\n)\nunless w < 1") == ("(\n  x and z\n)\nunless w < 1", ">=", "2")
    assert rg.split("x > 1.5 * min(y)") is None  # compared with a series, not a number
    assert rg.split("x >= 1 and y or z") is None  # two readings: no single threshold
    assert rg.split('x{l=">"} > bool 0') is None
    records = {"a:r": "sum by (job, correct) (rate(m[5m]))", "b:r": "2 * a:r"}
    assert rg.inline('b:r{correct="false"} > 1', records) == '(2 * (sum by (job, correct) (rate(m{correct="false"}[5m])))) > 1'
    with pytest.raises(TypeError, match="does not survive"):
        rg.inline('a:r{instance="x"}', records)


# promtool evaluates the Grafana rules as Grafana does: the instant query A, its last value B, the
# threshold C (`(A) op NUMBER`) or, for a whole-PromQL rule, every series A returns.
def _as_promql(rule: dict) -> str:
    query = rule["data"][0]["model"]["expr"]
    found = _threshold(rule)
    if found is None:
        return query
    op = {v: k for k, v in rg.THRESHOLD.items()}[found[0]]
    return f"({query}) {op} {found[1]:g}"


@pytest.mark.slow
def test_grafana_rules_fire_exactly_where_the_diagnosis_does_on_the_zoo(tmp_path, promtool):
    """As tests/test_rules_agreement.py for the Prometheus rules, with no recording rule loaded: the
    written-out series and the thresholds are the Prometheus rules' own (seed 0 of every scenario;
    the Prometheus test runs both seeds)."""
    tests = {}
    for gen in zoo.ZOO:
        log = zoo.make(gen, 0)
        tests.setdefault(log.max_reward, []).append(promtool_case(log, gen.__name__, gen.__name__)[0])
    runs = []
    for max_reward, cases in tests.items():
        p = rulegen.RuleParams(window=Thresholds().window * STEP_S, pending=0, max_reward=max_reward)
        # A stage's title is '<alert> escalated' or '<alert> forecast' (Grafana wants titles unique): the alert it stands for.
        rules = [{"alert": r["title"].removesuffix(" escalated").removesuffix(" forecast"), "expr": _as_promql(r),
                  "for": r["for"], "labels": {k: as_prometheus(v) for k, v in r["labels"].items()}}
                 for _, r in grafana_rules(p)]
        name = f"grafana-{max_reward:g}"
        (tmp_path / f"{name}.yml").write_text(yaml.safe_dump({"groups": [{"name": "grafana", "rules": rules}]}, width=1 << 20))
        groups = [one_scrape(cases[i : i + RUNS_A_GROUP]) for i in range(0, len(cases), RUNS_A_GROUP)]
        for half in (0, 1):  # two promtool processes per rules file: the machine has two cores
            if groups[half::2]:
                (tmp_path / f"{name}-{half}.test.yml").write_text(yaml.safe_dump(
                    {"rule_files": [f"{name}.yml"], "evaluation_interval": f"{STEP_S}s", "tests": groups[half::2]},
                    width=1 << 20))
                runs.append(subprocess.Popen([promtool, "test", "rules", f"{name}-{half}.test.yml"], cwd=tmp_path,
                                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for run in runs:
        out = run.communicate()[0]
        assert run.returncode == 0, out[-20000:]


# --- the provisioning files, as Grafana's provisioning types read them ----------------------------------------

def _strict(obj: dict, allowed: set[str], required: set[str], where: str) -> None:
    """Grafana's YAML decoding ignores unknown fields: a misspelt one would vanish. Here it fails."""
    assert isinstance(obj, dict), where
    assert set(obj) <= allowed, f"{where}: unknown fields {set(obj) - allowed}"
    assert required <= set(obj), f"{where}: missing {required - set(obj)}"


RULE_FIELDS = {"uid", "title", "condition", "data", "dasboardUid", "dashboardUid", "panelId", "noDataState",
               "execErrState", "for", "keepFiringFor", "missing_series_evals_to_resolve", "annotations", "labels",
               "isPaused", "notification_settings", "record"}
QUERY_FIELDS = {"refId", "queryType", "relativeTimeRange", "datasourceUid", "model"}


def check_rule_file(doc: dict) -> None:
    _strict(doc, {"apiVersion", "groups", "deleteRules"}, {"apiVersion", "groups"}, "file")
    assert doc["apiVersion"] == 1
    for g in doc["groups"]:
        _strict(g, {"orgId", "name", "folder", "interval", "rules"}, {"orgId", "name", "folder", "interval", "rules"}, "group")
        assert isinstance(g["orgId"], int) and g["orgId"] >= 1 and g["name"].strip() and g["folder"].strip()
        assert PROM_DURATION.match(g["interval"]), g["interval"]
        for r in g["rules"]:
            where = f"rule {r.get('title')}"
            _strict(r, RULE_FIELDS, {"uid", "title", "condition", "data"}, where)
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", r["uid"]), where  # Grafana's uid rule
            assert r["noDataState"] in ("NoData", "Alerting", "OK") and r["execErrState"] in ("Alerting", "Error", "OK")
            assert PROM_DURATION.match(r["for"]), where
            assert all(isinstance(v, str) for m in (r["labels"], r["annotations"]) for v in m.values()), where
            # Labels are env-interpolated: a template's `$labels` or `$values` must be written `$$`.
            assert not [v for v in r["labels"].values() if re.search(r"(?<!\$)\$(?!\$)", v)], where
            refs = [q["refId"] for q in r["data"]]
            assert r["condition"] in refs and len(set(refs)) == len(refs), where
            for q in r["data"]:
                _strict(q, QUERY_FIELDS, {"refId", "datasourceUid", "model"}, where)
                assert isinstance(q["model"], dict) and q["model"]["refId"] == q["refId"], where
                if q["datasourceUid"] == rg.EXPR:
                    # An expression reads refIds defined before it.
                    assert all(
                        ref in refs[: refs.index(q["refId"])]
                        for ref in re.findall(r"\$?([A-Z])\b", q["model"]["expression"])
                    ), where
                else:
                    _strict(q["relativeTimeRange"], {"from", "to"}, {"from", "to"}, where)
                    assert q["model"]["instant"] is True and q["model"]["expr"].strip(), where


def test_the_rule_file_parses_as_grafana_reads_it():
    check_rule_file(yaml.safe_load(COMMITTED.read_text()))
    broken = yaml.safe_load(COMMITTED.read_text())
    broken["groups"][0]["rules"][0]["noDataStat"] = "OK"  # the validator rejects what Grafana would drop
    with pytest.raises(AssertionError, match="noDataStat"):
        check_rule_file(broken)


ENV_SECRET = re.compile(r"^\$\{?[A-Z][A-Z0-9_]*\}?$")


def test_contact_points_parse_as_grafana_reads_them_and_hold_no_secret():
    doc = yaml.safe_load((FOLDER / "contact-points.yaml").read_text())
    _strict(doc, {"apiVersion", "contactPoints", "deleteContactPoints"}, {"apiVersion", "contactPoints"}, "file")
    names = set()
    for cp in doc["contactPoints"]:
        _strict(cp, {"orgId", "name", "receivers"}, {"name", "receivers"}, "contact point")
        names.add(cp["name"])
        for rcv in cp["receivers"]:
            _strict(rcv, {"uid", "type", "settings", "disableResolveMessage"}, {"uid", "type", "settings"}, cp["name"])
            assert rcv["settings"], "Grafana refuses a receiver without settings"
            # The SDK's contact point (the API's shape: one integration) round-trips unchanged.
            api = {"name": cp["name"], "uid": rcv["uid"], "type": rcv["type"], "settings": rcv["settings"]}
            assert json.loads(json.dumps(am.ContactPoint.from_json(api), cls=JSONEncoder)) == api
            secret = {"pagerduty": "integrationKey", "slack": "url"}[rcv["type"]]
            assert ENV_SECRET.match(rcv["settings"][secret]), f"{cp['name']}: {secret} must be $ENV_VAR, never literal"
            text = json.dumps(rcv["settings"])  # settings are interpolated: no `$` but the secrets'
            assert text.count("$") == 1, cp["name"]
    assert names == {"grpo-pagerduty", "grpo-chat"}


def _routes(route: dict):
    yield route
    for r in route.get("routes", []):
        yield from _routes(r)


ROUTE_FIELDS = {"receiver", "group_by", "object_matchers", "routes", "continue", "group_wait", "group_interval",
                "repeat_interval", "mute_time_intervals", "active_time_intervals", "matchers"}


def _sdk_matchers(route: dict, back: bool = False) -> dict:
    out = {**route, "routes": [_sdk_matchers(r, back) for r in route.get("routes", [])]}
    if "object_matchers" in route:
        out["object_matchers"] = [[m["Name"], m["Type"], m["Value"]] if back else {"Name": m[0], "Type": m[1], "Value": m[2]}
                                  for m in route["object_matchers"]]
    if not out["routes"]:
        del out["routes"]
    return out


def _match(matchers: list, labels: dict) -> bool:
    ops = {"=": lambda v, x: v == x, "!=": lambda v, x: v != x,
           "=~": lambda v, x: re.fullmatch(x, v) is not None, "!~": lambda v, x: re.fullmatch(x, v) is None}
    return all(ops[op](labels.get(name, ""), value) for name, op, value in matchers)


def _receiver(route: dict, labels: dict) -> tuple[str, list[str]]:
    """Alertmanager's routing (Grafana's, without `continue`): the first matching child, depth first."""
    for child in route.get("routes", []):
        if _match(child.get("object_matchers", []), labels):
            return _receiver(child, labels)
    return route["receiver"], route.get("mute_time_intervals", [])


def test_the_policy_parses_and_routes_every_rule_as_the_alertmanager_example_does():
    doc = yaml.safe_load((FOLDER / "notification-policies.yaml").read_text())
    _strict(doc, {"apiVersion", "policies", "muteTimes", "resetPolicies"}, {"apiVersion", "policies"}, "file")
    receivers = {cp["name"] for cp in yaml.safe_load((FOLDER / "contact-points.yaml").read_text())["contactPoints"]}
    mutes = {m["name"] for m in doc["muteTimes"]}
    for m in doc["muteTimes"]:
        _strict(m, {"orgId", "name", "time_intervals"}, {"name", "time_intervals"}, "mute timing")
        for ti in m["time_intervals"]:
            _strict(ti, {"times", "weekdays", "days_of_month", "months", "years", "location"}, set(), m["name"])
    (policy,) = doc["policies"]
    for r in _routes(policy):
        _strict(r, ROUTE_FIELDS | {"orgId"}, {"receiver"} if r is policy else set(), "route")
        assert r.get("receiver", policy["receiver"]) in receivers and set(r.get("mute_time_intervals", [])) <= mutes
        assert all(len(m) == 3 and m[1] in ("=", "!=", "=~", "!~") for m in r.get("object_matchers", []))
    # The SDK's policy (the API's route) round-trips it; the SDK writes a matcher as {name, type, value}
    # ({Name, Type, Value}: Go's field names) where Grafana's JSON (definition.ObjectMatchers) is [name, op, value].
    api = _sdk_matchers({k: v for k, v in policy.items() if k != "orgId"})
    assert json.loads(json.dumps(am.NotificationPolicy.from_json(api), cls=JSONEncoder)) == api
    assert _sdk_matchers(api, back=True) == {k: v for k, v in policy.items() if k != "orgId"}
    grpo = policy["routes"][0]
    assert grpo["group_by"] == ["job", "instance", "run_id"]  # one notification per run, as Alertmanager's
    want = {"critical": ("grpo-pagerduty", []), "warning": ("grpo-chat", ["grpo-off-hours"]),
            "info": ("grpo-chat", ["grpo-always"])}
    for _, rule in grafana_rules():
        sev = as_prometheus(rule["labels"]["severity"])
        for s in (["critical", "warning"] if "{{" in sev else [sev]):
            labels = {"alertname": rule["title"], "grafana_folder": "GRPO", **rule["labels"], "severity": s}
            assert _receiver(policy, labels) == want[s], rule["title"]
    assert _receiver(policy, {"alertname": "SomethingElse", "severity": "critical"}) == ("grpo-chat", [])
