"""docs/runbook.md, generated (`grpo-sentinel generate`; telemetry/generated.py).

One section per alert, from the health table (words), the rules (where the alert comes from) and
the panels that show each row (monitoring.PANEL_ROWS, which the dashboard's descriptions read too),
so the page, the rule and the dashboard cannot disagree.
"""

from __future__ import annotations

from grpo_sentinel.telemetry.health import rules
from grpo_sentinel.telemetry.health.table import OPERATIONAL, TABLE
from grpo_sentinel.telemetry.monitoring import PANEL_ROWS


def _panels_reading() -> dict[str, list[str]]:
    """Row id -> the dashboard panels that show it, in the dashboard's order."""
    return {r.id: [title for title, rows in PANEL_ROWS.items() if r.id in rows] for r in TABLE}


def markdown() -> str:
    out = ["# Runbook", "",
           "Generated from `telemetry/health/table.py`, `telemetry/health/rules.py` and `telemetry/dashboard.py`;",
           "do not edit by hand. One section per alert of `deploy/prometheus/grpo-rules.yml` (the anchors its",
           "`runbook_url`s point at). Dashboard panels are those of `grafana/dashboards/grpo-health.json`.", "",
           "Read the curves together: every single curve has two opposite explanations. The trainer evaluates",
           "every row itself (the dashboard's *Health conditions* lanes, the `health` column of `steps.csv`, and",
           "`grpo-sentinel diagnose` offline, with the evidence); the alerts below say where each page comes from.", ""]
    reading = _panels_reading()
    for r in TABLE:
        if r.id in rules.TRAINER_SIDE:
            source = (f"the trainer's verdict (`grpo_health_condition`, `grpo_health_episodes_total`). PromQL cannot "
                      f"express this row: {rules.TRAINER_SIDE[r.id]}.")
        else:
            source = "PromQL over the exported series, with the detectors' thresholds (`grpo-sentinel rules` to change them)."
            if r.id in rules.DIFFERS:
                source += f" Unlike the trainer: {rules.DIFFERS[r.id]}."
        panels = ", ".join(f"*{t}*" for t in reading[r.id]) or "*Health conditions*"
        out += [f"## {r.id}", "",
                f"**Alert** `{rules.alert_name(r.id)}`, {r.severity}. **Source**: {source}", "",
                f"**Means**: {r.signals}.", "",
                f"**Likely cause**: {r.cause}.", "",
                f"**Confirm on the dashboard**: {panels}: look for {r.signals}; then the *Health conditions* lane "
                f"`{r.id}` for when it began.", "",
                f"**Do**: {r.action}.", "",
                f"**Do not** {r.dont}.", ""] + ([f"**Source**: {r.source}.", ""] if r.source else [])
    names = {r["labels"]["condition"]: r["alert"] for r in rules.operational_rules(rules.RuleParams())}
    for anchor, severity, signals, cause, action in OPERATIONAL:
        out += [f"## {anchor}", "", f"**Alert** `{names[anchor]}`, {severity}.", "", f"**Means**: {signals}.", "",
                f"**Likely cause**: {cause}.", "", f"**Do**: {action}.", ""]
    out += ["## Rows PromQL cannot express", "",
            "These alerts page on the verdict the trainer exports, because the signal is not a window statistic",
            "of the scraped series:", ""]
    out += [f"- `{cid}`: {why}." for cid, why in rules.TRAINER_SIDE.items()]
    out += ["", "`tests/test_rules_agreement.py` feeds every scenario of the diagnosis zoo (tests/zoo.py) to",
            "`promtool test rules` and checks that the PromQL alerts that fire are exactly the conditions",
            "`grpo-sentinel diagnose` reports, row by row.", ""]
    return "\n".join(out)

