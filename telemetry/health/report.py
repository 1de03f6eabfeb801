"""What `grpo-sentinel diagnose` prints: verdicts, distribution summaries, curve shape; as text,
JSON or a markdown monitoring report."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from grpo_sentinel.telemetry.health.detectors import Diagnosis, unjudgeable
from grpo_sentinel.telemetry.health.lead import Lead, lead_time
from grpo_sentinel.telemetry.health.runlog import RunLog
from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.health.thresholds import Thresholds
from grpo_sentinel.telemetry.links import links
from grpo_sentinel.telemetry.stats import moving_average, summarize, windowed_sd


def with_generations(diag: Diagnosis, log: RunLog) -> Diagnosis:
    """Each condition linked to the generations behind it: the run's first trace within the condition's
    steps (the trainer traces the groups that explain an active condition, and lists them first)."""
    if not log.traces:
        return diag
    pages = links(log.trace_project)
    steps = np.array(sorted(log.traces))

    def linked(c):
        i = np.searchsorted(steps, c.first_step)
        if i == len(steps) or steps[i] > c.last_step:
            return c
        tid = log.traces[int(steps[i])]
        return replace(c, generations=(pages.trace(tid) if pages else "") or f"trace {tid} (step {steps[i]})")

    diag.conditions = [linked(c) for c in diag.conditions]
    return diag


def summary(log: RunLog, th: Thresholds) -> dict:
    s, w = log.series, th.window
    out: dict = {"source": log.source, "format": log.format, "steps": len(log),
                 "first_step": int(s["step"][0]), "last_step": int(s["step"][-1])}
    for name in ("reward", "kl", "loss", "entropy"):
        if log.has(name):
            out[name] = summarize(s[name].tolist())
    if log.has("reward"):
        ma = moving_average(s["reward"], w)
        wsd = windowed_sd(s["reward"], w)[w - 1:]
        out["reward_curve"] = {"start": _num(ma[w - 1] if len(ma) >= w else ma[-1]), "end": _num(ma[-1]),
                               "peak": _num(np.nanmax(ma)), "window": w,
                               "windowed_sd_median": _num(np.median(wsd)) if len(wsd) else math.nan}
    if log.has("frac_zero_std"):
        out["frac_zero_std_mean"] = _num(np.nanmean(s["frac_zero_std"]))
    if log.has("sample_acc") or log.baseline_acc is not None:
        steps, acc = _accuracy(log)
        out["sample_acc"] = {"steps": steps.astype(int).tolist(), "values": acc.round(4).tolist(), "n": log.eval_n}
    return out


def _accuracy(log: RunLog) -> tuple[np.ndarray, np.ndarray]:
    """The held-out evaluations (steps, accuracy), from the step-0 baseline when the record has it."""
    s = log.series
    acc = s.get("sample_acc", np.full(len(log), np.nan))
    ok = np.isfinite(acc)
    steps, values = s["step"][ok], acc[ok]
    if log.baseline_acc is not None and not (len(steps) and steps[0] == 0):
        steps, values = np.concatenate([[0.0], steps]), np.concatenate([[log.baseline_acc], values])
    return steps, values


def _num(x) -> float:
    return round(float(x), 6)


def to_json(diag: Diagnosis, log: RunLog, th: Thresholds) -> dict:
    """JSON-safe: a value that is not a finite number (no data for it) is null, never NaN."""
    return _finite({"conditions": [c.as_dict() for c in diag.conditions], "lead": lead_time(diag, log, th).as_dict(),
                    "summary": summary(log, th), "not_assessable": diag.not_assessable, "notes": log.notes,
                    "could_not_judge": unjudgeable(log, th)})


def _finite(x):
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def lead_words(lead: Lead) -> str:
    """'first warning at 125 (all_wrong_rising), first critical at 227 (loss_blowup); damage at 250 "
    "(...): paged 23 steps before'."""

    def at(step, cid):
        return f"at step {step} ({cid})" if step is not None else "none"
    text = f"first warning {at(lead.first_warning, lead.warning)}, first critical {at(lead.first_critical, lead.critical)}; "
    if lead.damage_step is None:
        return text + f"no damage ({lead.damage})"
    text += f"damage at step {lead.damage_step} ({lead.damage})"
    if lead.lead is None:
        return text + ": never paged critical"
    lo, hi = lead.lead_range
    if lo == hi:
        return text + (f": paged {hi} steps before it" if hi > 0 else
                       ": paged at the damage step" if hi == 0 else f": paged {-hi} steps after it")
    # Evaluations `resolution` steps apart: the damage happened somewhere in the interval before it was seen.
    return text + (f": paged between {lo} and {hi} steps before it" if lo > 0 else
                   f": paged between {-hi} and {-lo} steps after it" if hi < 0 else
                   f": paged between {-lo} steps after and {hi} before it") + f" (evaluations {lead.resolution} steps apart)"


def to_text(diag: Diagnosis, log: RunLog, th: Thresholds) -> str:
    sm = summary(log, th)
    lines = [f"{log.source} ({log.format}, {sm['steps']} steps, {sm['first_step']}-{sm['last_step']})"]
    lines += [f"  note: {n}" for n in log.notes]
    if not diag.conditions:
        why = unjudgeable(log, th)
        lines.append(f"could not judge: {why}" if why else "no condition found")
    for c in diag.conditions:
        lines.append(f"{c.severity.upper():8} {c.id} steps {c.first_step}-{c.last_step}: {c.evidence}")
        lines.append(f"         cause: {c.cause}; action: {c.action}")
        if c.generations:
            lines.append(f"         generations: {c.generations}")
    for name in ("reward", "kl"):
        if name in sm:
            d = sm[name]
            lines.append(
                f"{name}: mean {d['mean']:.4g} p5 {d['p5']:.4g} p50 {d['p50']:.4g} p95 {d['p95']:.4g} p99 {d['p99']:.4g}"
            )
    if "reward_curve" in sm:
        rc = sm["reward_curve"]
        lines.append(f"reward curve ({rc['window']}-step mean): {rc['start']:.3f} -> peak {rc['peak']:.3f} -> {rc['end']:.3f}; "
                     f"windowed sd (median) {rc['windowed_sd_median']:.3f}")
    lines.append("lead: " + lead_words(lead_time(diag, log, th)))
    if diag.not_assessable:
        lines.append("not assessable: " + "; ".join(f"{k} ({v})" for k, v in diag.not_assessable.items()))
    return "\n".join(lines)


def to_markdown(diag: Diagnosis, log: RunLog, th: Thresholds) -> str:
    sm = summary(log, th)
    out = [f"# Monitoring report: `{log.source}`", "",
           f"{sm['steps']} steps ({sm['first_step']}-{sm['last_step']}), format `{log.format}`.", ""]
    if log.notes:
        out += ["Ingest notes:", ""] + [f"- {n}" for n in log.notes] + [""]
    out += ["## Three curves, read together", ""]
    rc = sm.get("reward_curve")
    if rc:
        trend = "rose" if rc["end"] > rc["start"] + 0.02 else "fell" if rc["end"] < rc["start"] - 0.02 else "stayed flat"
        out.append(f"- **reward** ({rc['window']}-step mean) {trend}: {rc['start']:.3f} -> peak {rc['peak']:.3f} -> "
                   f"{rc['end']:.3f}; windowed sd {rc['windowed_sd_median']:.3f} (high = sawtooth, low = smooth).")
    if "kl" in sm:
        k = sm["kl"]
        out.append(f"- **KL** mean {k['mean']:.4g}, p95 {k['p95']:.4g}, p99 {k['p99']:.4g} "
                   f"(bound for `kl_runaway`: {th.kl_bound:g}).")
    else:
        out.append("- **KL**: not in this log; the KL rows cannot be assessed.")
    if "loss" in sm:
        lo = sm["loss"]
        out.append(f"- **loss** p5 {lo['p5']:.4g}, p50 {lo['p50']:.4g}, p95 {lo['p95']:.4g}, p99 {lo['p99']:.4g}: "
                   "it should stay roughly flat; large excursions are `loss_spike`.")
    if "sample_acc" in sm:
        a = sm["sample_acc"]
        pts = ", ".join(f"{s}: {100 * v:.1f} %" for s, v in zip(a["steps"], a["values"]))
        out.append(f"- **held-out accuracy** (n = {a['n'] or 'unknown'}): {pts}.")
    out += ["", "## Verdicts", ""]
    if not diag.conditions:
        why = unjudgeable(log, th)
        out.append(f"Could not judge: {why}." if why else "No condition of the health table holds.")
    else:
        out += ["| severity | condition | steps | evidence | likely cause | suggested action |", "|---|---|---|---|---|---|"]
        out += [f"| {c.severity} | `{c.id}` | {c.first_step}-{c.last_step} | {c.evidence}{_generations(c.generations)} "
                f"| {c.cause} | {c.action} |" for c in diag.conditions]
    out += ["", "## Lead time", "", lead_words(lead_time(diag, log, th)) + ".", "",
            "Damage is the first evaluation point where held-out accuracy sits 10 % and two standard errors below its "
            "running peak (without evaluations, a proxy: the reward's moving mean); the lead is the damage step minus the "
            "first critical verdict's, an interval as wide as the evaluation interval."]
    if diag.not_assessable:
        out += ["", "Not assessable from this log:", ""]
        out += [f"- `{k}` ({BY_ID[k].signals}): {v}" for k, v in diag.not_assessable.items()]
    return "\n".join(out) + "\n"


def plot(diag: Diagnosis, log: RunLog, th: Thresholds, path) -> None:
    """PNG of the curves read together: raw values faint, moving means bold, condition windows shaded
    (red critical, orange warning, blue info), held-out accuracy as points."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: .venv/bin/pip install -e '.[plot]'") from None
    s, w = log.series, th.window
    panels = [n for n in ("reward", "kl", "loss", "entropy", "frac_zero_std", "response_len") if log.has(n)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.0 * len(panels)), sharex=True, squeeze=False)
    axes[0, 0].set_xlim(0 if log.baseline_acc is not None else s["step"][0], s["step"][-1])
    colours = {"critical": "tab:red", "warning": "tab:orange", "info": "tab:blue"}
    for ax, name in zip(axes[:, 0], panels):
        ax.plot(s["step"], s[name], color="0.7", lw=0.6)
        ax.plot(s["step"], moving_average(s[name], w), color="black", lw=1.4, label=f"{w}-step mean")
        if name == "reward" and (log.has("sample_acc") or log.baseline_acc is not None):
            steps, acc = _accuracy(log)  # from the step-0 baseline: what the run learned
            ax.plot(steps, acc, "o-", color="tab:green", ms=3, label="held-out accuracy")
            ax.legend(loc="upper left", fontsize=7)
        for c in diag.conditions:
            ax.axvspan(c.first_step, max(c.last_step, c.first_step + 1), color=colours[c.severity], alpha=0.15)
        ax.set_ylabel(name, fontsize=8)
    for c in diag.conditions:
        axes[0, 0].annotate(c.id, (c.first_step, 1.0), xycoords=("data", "axes fraction"), fontsize=6,
                            color=colours[c.severity], rotation=90, va="top")
    axes[-1, 0].set_xlabel("step")
    fig.suptitle(f"{Path(log.source).name}: {len(diag.conditions)} condition(s)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _generations(where: str) -> str:
    if not where:
        return ""
    return f" ([generations]({where}))" if where.startswith("http") else f" (generations: {where})"
