"""The health alerts as Grafana-managed alert rules, in Grafana's file-provisioning format
(`apiVersion: 1`, `groups`), derived from the Prometheus rules of rules.py: one Grafana rule per
Prometheus alert, with its expression, `for:`, labels and annotations. Nothing here knows a row:
a row added to the table gets its Grafana rule with its Prometheus one.

Each rule is three steps on the Prometheus data source (built with grafana-foundation-sdk's
alerting and expression models):
  A  the alert's PromQL, an instant query, the recording rules it reads written out in place (so
     the rules need only the scraped series: no PrometheusRule has to be loaded for them);
  B  reduce A to its last value, the value Prometheus calls `$value` (on an instant query Grafana
     passes the number through, pkg/expr/commands.go; the step keeps the pipeline Grafana's editor
     makes, and right if A is switched to a range query);
  C  the condition. Where the PromQL is `VALUE op NUMBER [and|unless FILTERS]` (most rows), A is
     `VALUE [and|unless FILTERS]` and C a threshold `op NUMBER` on B, the same comparison Grafana
     shows on the rule's graph; otherwise (an `or` of two readings, a comparison with another
     series) A keeps the whole PromQL, which returns only the series that fire, and C is true for
     every series it returns, as Grafana's own importer of Prometheus rules does.
Templates read `$values.B.Value` where Prometheus reads `$value` (Grafana's `$value` is a string
of every step's value). Labels are interpolated from the environment when Grafana provisions the
file, so their `$` is written `$$`; annotations are not (Grafana 9.1 on).

Grafana's field names are those of its provisioning code (pkg/services/provisioning/alerting/
rules_types.go, AlertRuleGroupV1 / AlertRuleV1 / QueryV1, and values/values.go for the `$$`
escape), read at commit 0085cf86 of grafana/grafana's main branch.

`grpo-sentinel rules --format grafana [--set ...]` prints it; `grpo-sentinel generate` writes the
defaults to deploy/grafana/grpo-alert-rules.yaml.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, fields, replace

import yaml

from grpo_sentinel.telemetry import monitoring
from grpo_sentinel.telemetry.health import rules as rulegen

EXPR = "__expr__"  # the data source uid of Grafana's server-side expressions
VALUE, REDUCED, CONDITION = "A", "B", "C"
# PromQL comparison -> Grafana threshold evaluator.
THRESHOLD = {">": "gt", "<": "lt", ">=": "gte", "<=": "lte", "==": "eq", "!=": "ne"}
# A number, or a setting the Helm template fills in (rules_helm.Setting's placeholder).
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|@@\d+@@"
_TOKEN = re.compile(r"==|!=|>=|<=|>|<|(?:and|or|unless)(?![\w:])")


@dataclass(frozen=True)
class GrafanaParams:
    datasource: str = "prometheus"  # uid of the Prometheus data source (kube-prometheus-stack's Grafana: prometheus)
    folder: str = "GRPO"  # the folder the rules live in (made by provisioning if absent)
    interval: str = "1m"  # how often each group is evaluated
    org: int = 1
    uid_prefix: str = "grpo"  # rule uids are <prefix>-<condition>: two deployments in one Grafana need two prefixes


GRAFANA_SETTINGS = tuple(f.name for f in fields(GrafanaParams))


def with_grafana_settings(settings: list[str]) -> tuple[GrafanaParams, list[str]]:
    """Take the GrafanaParams NAME=VALUE settings out of `settings` (each checked: ValueError says
    what to write); the rest are rules.py's."""
    g, rest = GrafanaParams(), []
    for s in settings:
        name, _, value = s.partition("=")
        if name not in GRAFANA_SETTINGS:
            rest.append(s)
            continue
        if name == "org":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"org={value!r} is not an organisation id (a whole number >= 1)")
            g = replace(g, org=int(value))
        elif name == "interval":
            seconds = monitoring.parse_duration(value)  # 60, 1m, 90s as for window=; Grafana takes 1m, 90s
            if seconds == 0 or seconds % 10:
                raise ValueError(f"interval={value!r}: Grafana evaluates in multiples of 10 s (e.g. 30s, 1m)")
            g = replace(g, interval=monitoring.duration(seconds))
        elif name == "uid_prefix" and not re.fullmatch(r"[A-Za-z0-9_-]{1,12}", value):
            raise ValueError(f"uid_prefix={value!r}: 1 to 12 letters, digits, - or _ (a rule uid is at most 40)")
        elif not value.strip():
            raise ValueError(f"{name}= is empty; give e.g. {name}={getattr(GrafanaParams(), name)}")
        else:
            g = replace(g, **{name: value})
    return g, rest


def _top_level(expr: str) -> list[tuple[int, str]]:
    """(position, operator) of every comparison and set operator outside brackets and strings."""
    out, depth, quote, i = [], 0, "", 0
    while i < len(expr):
        c = expr[i]
        if quote:
            i += 2 if c == "\\" else 1
            quote = "" if c == quote else quote
            continue
        if c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and (m := _TOKEN.match(expr, i)) and not (m.group(0)[0].isalpha() and i and
                                                                   (expr[i - 1].isalnum() or expr[i - 1] in "_:")):
            out.append((i, m.group(0)))
            i = m.end()
            continue
        i += 1
    return out


def split(expr: str) -> tuple[str, str, str] | None:
    """`VALUE op NUMBER [and|unless FILTERS]` -> (`VALUE [and|unless FILTERS]`, op, NUMBER): the same
    series fire either way, since `and` and `unless` only keep or drop VALUE's series by their
    labels. None when the rule is not a threshold on its value."""
    tokens = _top_level(expr)
    if not tokens or any(t == "or" for _, t in tokens):
        return None
    (i, op), later = tokens[0], tokens[1:]
    head = expr[:i].rstrip()
    if op in ("and", "unless"):  # `( ... ) unless ...`: the threshold may be the group's
        inner = split(head[1:-1]) if head.startswith("(") and _closing(head) == len(head) - 1 else None
        return None if inner is None else (f"({inner[0]})" + expr[len(head):], inner[1], inner[2])
    m = re.compile(rf"\s*({_NUMBER})").match(expr, i + len(op))
    if m is None:
        return None
    end = expr[m.end():later[0][0]] if later else expr[m.end():]
    if end.strip() or (later and later[0][1] not in ("and", "unless")):
        return None  # the number is part of an expression (`1.5 * min(...)`)
    return head + expr[m.end():], op, m.group(1)


def _closing(text: str) -> int:
    """Index of the bracket that closes text[0]."""
    depth = 0
    for j, c in enumerate(text):
        depth += c in "([{"
        depth -= c in ")]}"
        if depth == 0:
            return j
    return -1


def inline(expr: str, records: dict[str, str]) -> str:
    """The expression with every recorded series written out as its recording rule's expression.
    A selector on a recorded series (`name{correct="false"}`) moves into the rule's own selectors,
    which is exact when the label survives every aggregation of that rule (checked)."""
    if not records:
        return expr
    names = "|".join(re.escape(n) for n in sorted(records, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w:])({names})(?![\w:])(\{{[^}}]*\}})?")

    def written_out(m: re.Match) -> str:
        body = inline(records[m.group(1)], records)
        return f"({_restrict(body, m.group(2)) if m.group(2) else body})"

    return pattern.sub(written_out, expr)


def _restrict(body: str, matchers: str) -> str:
    pairs = re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers)
    if len(pairs) != matchers.count("=") or not pairs:
        raise TypeError(f"only equality selectors can move into a recording rule: {matchers}")
    kept = [{x.strip() for x in k.split(",")} for k in re.findall(r"\bby \(([^)]*)\)", body)]
    for label, _ in pairs:
        if "without (" in body or not kept or any(label not in k for k in kept):
            raise TypeError(f"{label} does not survive every aggregation of: {body}")
    extra = ", ".join(f'{k}="{v}"' for k, v in pairs)

    def add(m: re.Match) -> str:
        inside = m.group(2)
        return f"{m.group(1)}{{{inside + ', ' if inside else ''}{extra}}}"

    out, n = re.subn(r"(?<![\w:])([a-zA-Z_][\w]*)(?:\{([^}]*)\})?(?=\[)", add, body)
    if n == 0:
        raise TypeError(f"no range selector to restrict in: {body}")
    return out


def _grafana_template(text: str) -> str:
    """Prometheus's `$value` is Grafana's `$values.B.Value` (a number; Grafana's `$value` is text)."""
    return re.sub(r"\$value\b", f"$values.{REDUCED}.Value", text)


def _states(labels: dict[str, str]) -> tuple[str, str]:
    """(noDataState, execErrState). No data is the healthy answer for every rule: a run's series exist
    only while it trains (the daemon exports none between runs, where a page would be false), a run
    younger than its windows has none to judge, and a whole-PromQL rule returns series only when it
    fires; Prometheus reads an empty result the same way. A query that fails cannot clear a
    critical condition (a collapsing or stalled run must not go silent because Prometheus timed
    out), so a critical rule then fires as itself; the others raise Grafana's DatasourceError alert,
    which carries the rule's labels and so reaches the same channel."""
    return "OK", ("Alerting" if labels["severity"] == "critical" else "Error")


def rule(prom: dict, records: dict[str, str], g: GrafanaParams):
    """One Prometheus alerting rule as an SDK alerting.Rule (folder, org and group are the file's group's)."""
    # Imported here: the SDK is the `dashboards` extra, and `grpo-sentinel rules` (Prometheus) needs none.
    from grafana_foundation_sdk.builders import alerting, prometheus
    from grafana_foundation_sdk.builders import expr as ex
    from grafana_foundation_sdk.models import alerting as am
    from grafana_foundation_sdk.models import dashboard as dm

    threshold = split(prom["expr"])
    query_text = inline(threshold[0] if threshold else prom["expr"], records)
    source = dm.DataSourceRef(type_val="prometheus", uid=g.datasource)
    server = dm.DataSourceRef(type_val=EXPR, uid=EXPR)
    query = (alerting.Query(VALUE).datasource_uid(g.datasource)
             .relative_time_range(am.RelativeTimeRange(from_val=600, to=0))  # an instant query reads only its end
             .model(prometheus.Dataquery().expr(query_text).instant().ref_id(VALUE).datasource(source)))
    reduce = (alerting.Query(REDUCED).datasource_uid(EXPR)
              .model(ex.TypeReduce().expression(VALUE).reducer("last").ref_id(REDUCED).datasource(server)))
    if threshold:
        _, op, number = threshold
        evaluator = ex.ExprTypeThresholdConditionsEvaluator().type(THRESHOLD[op]).params([_number(number)])
        check = ex.TypeThreshold().expression(REDUCED).conditions([ex.ExprTypeThresholdConditions().evaluator(evaluator)])
    else:  # every series the PromQL returns fires, whatever its value (NaN included, as in Prometheus)
        b = f"${REDUCED}"
        check = ex.TypeMath().expression(f"is_number({b}) || is_nan({b}) || is_inf({b})")
    condition = alerting.Query(CONDITION).datasource_uid(EXPR).model(check.ref_id(CONDITION).datasource(server))
    labels = {k: _grafana_template(v) for k, v in prom["labels"].items()}
    annotations = {k: _grafana_template(v) for k, v in prom["annotations"].items()}
    if any("| query" in v for v in annotations.values()):
        raise ValueError("Grafana templates have no `query` function: keep run_id in group_by (the dashboard links "
                         "read the run from the alert's labels)")
    no_data, exec_err = _states(prom["labels"])
    # A drift row's escalated stage is a second rule of the same alert; Grafana wants titles unique in a folder.
    stage = f"-{prom['labels']['stage']}" if "stage" in prom["labels"] else ""
    uid = f"{g.uid_prefix}-{prom['labels']['condition']}{stage}"
    if len(uid) > 40:  # Grafana's limit; a uid must never be cut into another rule's
        raise ValueError(f"rule uid {uid!r} is longer than Grafana's 40 characters: shorten uid_prefix")
    return (alerting.Rule(prom["alert"] + stage.replace("-", " ")).uid(uid)
            .queries([query, reduce, condition]).condition(CONDITION)
            .for_val(prom.get("for", "0s")).no_data_state(no_data).exec_err_state(exec_err)
            .labels({k: v.replace("$", "$$") for k, v in labels.items()})  # labels are env-interpolated
            .annotations(annotations).is_paused(False))


def _number(text: str) -> float | str:
    """The threshold; a Helm setting's placeholder stays text (rules_helm writes it as a bare number)."""
    return text if text.startswith("@@") else float(text)


GROUP_FIELDS = ("folderUID", "orgID", "ruleGroup")  # the SDK rule's; the file says them once per group


def as_file_rule(r) -> dict:
    """An SDK rule as the file format's rule: the SDK's JSON less the fields its group carries."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    out = json.loads(json.dumps(r.build(), cls=JSONEncoder))
    for k in GROUP_FIELDS:
        del out[k]
    return out


def groups(p: rulegen.RuleParams = rulegen.RuleParams(), g: GrafanaParams = GrafanaParams()) -> list[dict]:
    prom = rulegen.rules(p)["groups"]
    records = {r["record"]: r["expr"] for grp in prom for r in grp["rules"] if "record" in r}
    out = []
    for grp in prom:
        alerts = [r for r in grp["rules"] if "alert" in r]
        if alerts:
            out.append({"orgId": g.org, "name": grp["name"], "folder": g.folder, "interval": g.interval,
                        "rules": [as_file_rule(rule(a, records, g)) for a in alerts]})
    return out


def provisioning(p: rulegen.RuleParams = rulegen.RuleParams(), g: GrafanaParams = GrafanaParams()) -> dict:
    return {"apiVersion": 1, "groups": groups(p, g)}


def render(p: rulegen.RuleParams = rulegen.RuleParams(), g: GrafanaParams = GrafanaParams()) -> str:
    header = ("# grpo-sentinel health alerts as Grafana-managed rules (file provisioning), generated by "
              "`grpo-sentinel rules --format grafana` (telemetry/health/rules_grafana.py); do not edit.\n"
              f"# The same rules as deploy/prometheus/grpo-rules.yml: window {rulegen.duration(p.window)}, "
              f"for {rulegen.duration(p.pending)}; data source uid {g.datasource}, folder {g.folder}, "
              f"evaluated every {g.interval}. Put it in Grafana's provisioning/alerting/ directory.\n")
    return header + yaml.dump(provisioning(p, g), Dumper=rulegen._Dumper, sort_keys=False, width=4096, allow_unicode=True)

