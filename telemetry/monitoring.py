"""The monitoring config: what the Prometheus rules, the Grafana-managed rules and the dashboards all
select, aggregate by and average over, in one place (as kubernetes-mixin's config.libsonnet). A
deployment overrides it without forking: `grpo-sentinel rules --set window=10m --set
selector='namespace="ml"'` for the rules (rules.RuleParams is a Monitoring plus the alerts' own
settings), `grpo-sentinel dashboard --set ...` for the dashboards, the chart's
`prometheusRule.settings` for the windows.

Also two facts the generated files share that are no setting: the health dashboard's uid (the alerts
link it) and which of its panels show which health-table row (the dashboard's "read with" lines, the
runbook's "confirm on the dashboard").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

HEALTH_UID = "grpo-health"  # the health dashboard's uid: alerts link /d/<uid>?var-job=...&var-run=...


@dataclass(frozen=True)
class Monitoring:
    # s: the detectors' `window` of steps, in time (5 min: 20 steps of 15 s); the dashboards' $window default
    window: int = 300
    pending: int = 120  # s a condition must hold before it fires (`for:`); window means already smooth the noise
    stall: int = 900  # s without a completed step before GRPOTrainingStalled
    # The labels every rule aggregates by (kubernetes-mixin style): one run of one trainer. run_id
    # keeps consecutive runs of the daemon on one pod apart in every window.
    group_by: tuple[str, ...] = ("job", "instance", "run_id")
    # Label matchers every rule and panel adds to every exported series it reads, e.g. namespace="ml":
    # one grpo-sentinel among others. Put the label in group_by too, so that the alerts carry it (the
    # service dashboard's ALERTS panel selects by job alone: an alert has only the group_by labels).
    selector: str = ""


DURATIONS = ("window", "pending", "stall")  # Monitoring fields in seconds, set as 300, 90s, 5m, 1h

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_MATCHER = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*')


def duration(seconds: float) -> str:
    """Prometheus duration: 300 -> '5m', 90 -> '90s'."""
    if not isinstance(seconds, (int, float)):  # a Helm values expression (rules_helm.py) formats itself
        return format(seconds, "duration")
    s = int(round(seconds))
    for unit, size in (("h", 3600), ("m", 60)):
        if s % size == 0 and s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def parse_duration(text: str) -> int:
    """'5m' -> 300, '90s' -> 90, '1h30m' -> 5400, '300' -> 300."""
    if re.fullmatch(r"\d+", text):
        return int(text)
    parts = re.findall(r"(\d+)([hms])", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r} (use e.g. 300, 90s, 5m, 1h)")
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


def parse(name: str, value: str) -> object:
    """The value of Monitoring field `name` from its NAME=VALUE text; ValueError says what to write."""
    if name == "group_by":
        labels = tuple(x.strip() for x in value.split(",") if x.strip())
        if not labels or any(not _LABEL.fullmatch(x) for x in labels):
            raise ValueError(f"group_by={value!r}: give comma-separated label names, e.g. job,instance,run_id")
        return labels
    if name == "selector":
        if value.strip() and not all(_MATCHER.fullmatch(m) for m in _split_matchers(value)):
            raise ValueError(f"selector={value!r}: give PromQL label matchers without braces, e.g. "
                             'namespace="ml",cluster=~"eu-.*"')
        return value.strip()
    try:
        seconds = parse_duration(value)
        if seconds == 0 and name != "pending":  # only `for:` may be 0
            raise ValueError
    except ValueError:
        want = "duration" if name == "pending" else "positive duration"
        raise ValueError(f"{name}={value!r} is not a {want}") from None
    return seconds


def with_settings(m: Monitoring, settings: list[str]) -> Monitoring:
    """Apply NAME=VALUE settings of Monitoring's fields; ValueError says what to write instead."""
    known = [f.name for f in fields(Monitoring)]
    changes = {}
    for s in settings:
        name, eq, value = s.partition("=")
        if not eq:
            raise ValueError(f"{s!r}: write NAME=VALUE, e.g. window=10m")
        if name not in known:
            raise ValueError(f"unknown monitoring setting {name!r}; known: {', '.join(known)}")
        changes[name] = parse(name, value)
    return replace(m, **changes)


def _split_matchers(text: str) -> list[str]:
    """'a="x,y", b=~"z"' -> ['a="x,y"', ' b=~"z"']: commas outside quotes."""
    return re.findall(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+', text)


def series(m: Monitoring, metric: str, matchers: str = "") -> str:
    """`metric{matchers}` with the config's selector first: every series a rule or panel reads."""
    inside = ", ".join(x for x in (m.selector, matchers) if x)
    return f"{metric}{{{inside}}}" if inside else metric


# Which health-table rows each panel of the health dashboard shows, in the dashboard's order: the
# dashboard writes the rows' "read with" lines into the panel's description, and the runbook lists
# the panels under each row's "confirm on the dashboard".
PANEL_ROWS: dict[str, tuple[str, ...]] = {
    "Skipped updates": ("nonfinite",),
    "Reward": ("reward_saturated", "plateau_grader_loose", "kl_runaway", "no_progress"),
    "Held-out accuracy vs reward": ("reward_hacking", "late_degradation", "plateau_grader_loose"),
    "Groups without signal": ("signal_vanished", "kl_dominant", "plateau_small_group", "policy_collapse"),
    "KL to the reference": ("kl_runaway", "kl_dominant", "plateau_kl_flat", "kl_offset"),
    "Loss": ("loss_spike", "loss_blowup", "kl_only_learning"),
    "Gradient norm": ("grad_norm_spike", "zero_gradient"),
    "Ratio clip": ("clip_imbalance",),
    "Entropy": ("entropy_collapse", "exploration"),
    "Entropy / ln V": ("entropy_blowup",),
    "Advantage mean": ("adv_mean_drift",),
    "Completion length": ("length_pathology",),
    "Truncation": ("length_capped",),
    "Repetition": ("repetition",),
    "Train/inference mismatch": ("train_inference_mismatch",),
}
