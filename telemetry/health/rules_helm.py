"""The alert rules as a Helm template: the Helm chart's PrometheusRule holds exactly the rules that
rules.py generates (and promtool tests), with the windows and thresholds from the chart's values.

Helm cannot run Python, so the generator runs here once, with every setting replaced by a `Setting`:
a stand-in that carries the Helm expression of its value (`$kl_bound`, bound from
`.Values.prometheusRule.settings.kl_bound` or the generator's default). Arithmetic on it builds the
expression (`2 * window` -> `(mul 2 $window)`), and where the generator turns a value into text
(`_num`'s `:g`, `duration()`, an f-string) it leaves a placeholder that becomes a Helm action printing
the value the same way. Prometheus's own `{{ ... }}` templates are escaped for Helm. The one setting
the generator branches on, `grafana` (alerts get a `dashboard_url`), is generated both ways and
chosen by `{{ if }}`.

The same generator run through rules_grafana.py gives the Grafana-managed rules' provisioning file
(`grpo-sentinel.rules.grafana`, for the chart's `grafana_alert` ConfigMap), with the Grafana-only
settings (data source, folder, interval, org, uid prefix) from `.Values.grafanaAlerts`.

`grpo-sentinel generate` writes it to deploy/helm/grpo-sentinel/templates/_rules.tpl (tests/test_helm.py
renders the chart with non-default values against `rules(with_settings(...))`). A setting the generator uses in a way this
cannot express (a comparison, an `if`) raises TypeError here, never a silently wrong chart.
"""

from __future__ import annotations

import json
import re
from dataclasses import fields, replace

import yaml

from grpo_sentinel.telemetry.health import rules as rulegen
from grpo_sentinel.telemetry.health import rules_grafana
from grpo_sentinel.telemetry.monitoring import DURATIONS

SETTINGS = ".Values.prometheusRule.settings"  # NAME: VALUE, the names of `grpo-sentinel rules --set`
GRAFANA = ".Values.grafanaUrl"  # one value for the alerts' dashboard_url and the daemon's trace links
_SLOT = re.compile(r"@@(\d+)@@")  # a Setting turned into text; no brace, so it survives the escaping


class Setting:
    """A setting's value as a Helm expression of `kind` (int, float, str). `truthy`: the branch of the
    template in which it is known to be non-empty."""

    def __init__(self, expr: str, kind: type, slots: dict[str, int], truthy: bool = False):
        self.expr, self.kind, self.slots, self.truthy = expr, kind, slots, truthy

    def _slot(self, action: str) -> str:
        # One placeholder per action: both grafana branches then give equal text where they agree.
        return f"@@{self.slots.setdefault(action, len(self.slots))}@@"

    def __format__(self, spec: str) -> str:
        if spec == "g" and self.kind in (int, float):  # _num: Python's %g is Go's %.6g
            return self._slot(f'printf "%.6g" (float64 {self.expr})')
        if spec == "duration" and self.kind is int:
            return self._slot(f'include "grpo-sentinel.rules.duration" {self.expr}')
        if spec == "" and self.kind in (int, str):
            return self._slot(self.expr)
        # str(float) is repr, which Go cannot reproduce ('2.0'); the generator formats floats with _num.
        raise TypeError(f"cannot template {self.expr} formatted as {spec!r}")

    def __str__(self) -> str:
        return format(self, "")

    def _op(self, other, int_fn: str, float_fn: str, swap: bool = False) -> Setting:
        if isinstance(other, Setting):
            kind, rhs = (int if self.kind is other.kind is int else float), other.expr
        elif isinstance(other, (int, float)) and not isinstance(other, bool):
            kind, rhs = (int if self.kind is int and isinstance(other, int) else float), repr(other)
        else:
            return NotImplemented
        if str in (self.kind, getattr(other, "kind", None)):
            raise TypeError(f"arithmetic on a text setting: {self.expr}, {rhs}")
        a, b = (rhs, self.expr) if swap else (self.expr, rhs)
        return Setting(f"({int_fn if kind is int else float_fn} {a} {b})", kind, self.slots)

    def __mul__(self, o): return self._op(o, "mul", "mulf")
    def __rmul__(self, o): return self._op(o, "mul", "mulf", swap=True)
    def __add__(self, o): return self._op(o, "add", "addf")
    def __radd__(self, o): return self._op(o, "add", "addf", swap=True)
    def __sub__(self, o): return self._op(o, "sub", "subf")
    def __rsub__(self, o): return self._op(o, "sub", "subf", swap=True)

    def rstrip(self, chars: str) -> Setting:
        if self.kind is not str:
            raise TypeError(f"rstrip on {self.expr}")
        pattern = json.dumps("[" + re.escape(chars) + "]+$")
        return Setting(f'(regexReplaceAll {pattern} {self.expr} "")', str, self.slots, self.truthy)

    def __bool__(self) -> bool:
        if self.truthy:
            return True
        raise TypeError(f"the generator branches on {self.expr}: generate both branches (as for grafana)")

    def _compare(self, other):
        raise TypeError(f"the generator compares {self.expr}: a Helm template cannot know the result")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _compare
    __hash__ = None


# Not chart settings: grafana is the chart's grafanaUrl; group_by and selector stay the generator's (job,
# instance, run_id and no selector: the chart's ServiceMonitor scrapes only this release's pods); langfuse is
# a second setting the generator branches on, which this emitter does not combine with grafana (render
# `grpo-sentinel rules --set langfuse=...`).
NOT_SETTABLE = ("thresholds", "grafana", "group_by", "selector", "langfuse")
# Thresholds a rule computes with beyond + - * (kl_acceleration takes a square root; sprig has none):
# fixed at the generator's default in the chart.
NONLINEAR = ("kl_accel",)


def settable() -> dict[str, object]:
    """NAME -> default of every `grpo-sentinel rules --set` name the chart's values set."""
    p = rulegen.RuleParams()
    own = {f.name: getattr(p, f.name) for f in fields(p) if f.name not in NOT_SETTABLE}
    return {**own, **{n: getattr(p.thresholds, n) for n in rulegen.RULE_THRESHOLDS if n not in NONLINEAR}}


def _go(value) -> str:
    """A Python default as a Go template literal."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _bindings() -> str:
    """One template variable per setting: its value from values, else the generator's default."""
    lines = [f"{{{{- $s := {SETTINGS} }}}}", f"{{{{- $grafana := {GRAFANA} | toString }}}}"]
    for name, default in settable().items():
        got = f'dig "{name}" {_go(default)} $s'
        if name in DURATIONS:
            positive = "false" if name == "pending" else "true"  # as with_settings: only `for:` may be 0
            lines.append(
                f'{{{{- ${name} := include "grpo-sentinel.rules.seconds" (list "{name}" ({got}) {positive}) | int64 }}}}'
            )
        else:
            conv = {int: "int64", float: "float64", str: "toString"}[type(default)]
            lines.append(f"{{{{- ${name} := {got} | {conv} }}}}")
    return "\n".join(line[:-2] + "-}}" for line in lines)  # -}}: no blank line before `groups:`


def _params(slots: dict[str, int], grafana) -> rulegen.RuleParams:
    kind = {name: (int if name in DURATIONS else type(d)) for name, d in settable().items()}
    s = {name: Setting(f"${name}", kind[name], slots) for name in kind}
    own = {f.name for f in fields(rulegen.RuleParams)}
    p = rulegen.RuleParams(**{k: v for k, v in s.items() if k in own}, grafana=grafana)
    return replace(p, thresholds=replace(p.thresholds, **{k: v for k, v in s.items() if k not in own}))


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


def _leaf(key: str, value, indent: int, slots: dict[str, int]) -> str:
    """`key: value` as YAML, Prometheus's braces escaped for Helm, placeholders made Helm actions."""
    text = yaml.dump({key: value}, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)
    text = re.sub(r"\{\{|\}\}", lambda m: '{{ "' + m.group(0) + '" }}', text)
    # A value that is one setting (a threshold, a duration, a JSON-quoted name) is the action's text:
    # unquoted, so that a number stays a number.
    text = re.sub(r"^(\s*(?:- )?(?:[\w-]+: )?)'(@@\d+@@)'$", r"\1\2", text, flags=re.M)
    actions = {i: action for action, i in slots.items()}
    text = _SLOT.sub(lambda m: "{{ " + actions[int(m.group(1))] + " }}", text)
    return "".join(" " * indent + line + "\n" for line in text.splitlines())


def _emit(with_: object, without: object, key: str, indent: int, slots: dict[str, int]) -> str:
    """`key: ...` for the value with grafana set and without: shared where equal, `{{ if }}` where not."""
    if with_ == without:
        return _leaf(key, with_, indent, slots)
    if isinstance(with_, dict) and isinstance(without, dict):
        body = "".join(_branch(with_.get(k), without.get(k), k, indent + 2, slots) for k in {**without, **with_})
        return " " * indent + f"{key}:\n" + body
    if isinstance(with_, list) and isinstance(without, list) and len(with_) == len(without):
        out = " " * indent + f"{key}:\n"
        for a, b in zip(with_, without):
            if not (isinstance(a, dict) and isinstance(b, dict)):
                raise TypeError(f"{key}: a list of non-mappings")
            first = next(iter(a))
            if a.get(first) != b.get(first):
                raise TypeError(f"{key}: an item whose first key depends on grafana")
            item = "".join(_branch(a.get(k), b.get(k), k, indent + 2, slots) for k in {**b, **a})
            out += " " * indent + "- " + item[indent + 2:]
        return out
    raise TypeError(f"{key}: grafana changes the structure, not only values")


def _branch(with_, without, key: str, indent: int, slots: dict[str, int]) -> str:
    if without is None:
        return "{{- if $grafana }}\n" + _leaf(key, with_, indent, slots) + "{{- end }}\n"
    if with_ is None:
        return "{{- if not $grafana }}\n" + _leaf(key, without, indent, slots) + "{{- end }}\n"
    if with_ == without or isinstance(with_, (dict, list)):
        return _emit(with_, without, key, indent, slots)
    return ("{{- if $grafana }}\n" + _leaf(key, with_, indent, slots) + "{{- else }}\n"
            + _leaf(key, without, indent, slots) + "{{- end }}\n")


HELPERS = r'''{{- /* A duration setting in seconds: 300, "90s", "5m", "1h30m" (as `grpo-sentinel rules --set`). */}}
{{- define "grpo-sentinel.rules.seconds" -}}
{{- $name := index . 0 }}{{- $v := index . 1 }}
{{- $d := ternary $v (printf "%d" (int64 $v)) (kindIs "string" $v) }}
{{- if not (regexMatch "^([0-9]+|([0-9]+h)?([0-9]+m)?([0-9]+s)?)$" $d) }}
{{- fail (printf "prometheusRule.settings.%s=%v is not a duration (use e.g. 300, 90s, 5m, 1h)" $name $v) }}
{{- end }}
{{- $total := 0 }}
{{- if regexMatch "^[0-9]+$" $d }}{{ $total = atoi $d }}
{{- else }}
{{- range $unit, $size := dict "h" 3600 "m" 60 "s" 1 }}
{{- $total = add $total (mul $size (regexFind (printf "[0-9]+%s" $unit) $d | trimSuffix $unit | default "0" | atoi)) }}
{{- end }}
{{- end }}
{{- if and (index . 2) (eq $total 0) }}
{{- fail (printf "prometheusRule.settings.%s=%v is not a positive duration" $name $v) }}
{{- end }}
{{- $total }}
{{- end }}

{{- /* Seconds as a Prometheus duration: 300 -> 5m, 90 -> 90s (rules.duration). */}}
{{- define "grpo-sentinel.rules.duration" -}}
{{- $s := int64 . }}
{{- if and (ge $s 3600) (eq (mod $s 3600) 0) }}{{ div $s 3600 }}h
{{- else if and (ge $s 60) (eq (mod $s 60) 0) }}{{ div $s 60 }}m
{{- else }}{{ $s }}s
{{- end }}
{{- end }}
'''


GRAFANA_ALERTS = ".Values.grafanaAlerts"  # the Grafana-only settings (rules_grafana.GrafanaParams)


def _grafana_params(slots: dict[str, int]) -> rules_grafana.GrafanaParams:
    """GrafanaParams whose values are the chart's: names JSON-quoted (they stand alone in the YAML),
    the uid prefix plain (part of each uid; the schema allows only [A-Za-z0-9_-])."""
    def slot(action: str) -> str:
        return f"@@{slots.setdefault(action, len(slots))}@@"
    return rules_grafana.GrafanaParams(datasource=slot("$g.datasourceUid | toJson"), folder=slot("$g.folder | toJson"),
                                       interval=slot("$g.interval | toJson"), org=slot("$g.orgId | int64"),
                                       uid_prefix=slot("$g.uidPrefix"))


def template() -> str:
    slots: dict[str, int] = {}
    with_p, without_p = _params(slots, Setting("$grafana", str, slots, truthy=True)), _params(slots, "")
    with_, without = rulegen.rules(with_p), rulegen.rules(without_p)
    g = _grafana_params(slots)
    g_with, g_without = rules_grafana.provisioning(with_p, g), rules_grafana.provisioning(without_p, g)
    return ("{{- /* Generated by `grpo-sentinel generate` (telemetry/health/rules_helm.py) from "
            "telemetry/health/rules.py; do not edit. */}}\n" + HELPERS
            + '\n{{- /* The PrometheusRule spec: rules(RuleParams(...the values...)). */}}\n'
            + '{{- define "grpo-sentinel.rules.spec" -}}\n' + _bindings() + "\n"
            + _emit(with_["groups"], without["groups"], "groups", 0, slots) + "{{- end }}\n"
            + '\n{{- /* The same rules as Grafana-managed rules (rules_grafana.provisioning), a provisioning file. */}}\n'
            + '{{- define "grpo-sentinel.rules.grafana" -}}\n' + _bindings() + "\n"
            + f"{{{{- $g := {GRAFANA_ALERTS} -}}}}\n" + _leaf("apiVersion", 1, 0, slots)
            + _emit(g_with["groups"], g_without["groups"], "groups", 0, slots) + "{{- end }}\n")

