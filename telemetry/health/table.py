"""The health / pathology table (MISSION.md) as data: one row per condition. Detectors, the
diagnosis report, the alert annotations and docs/runbook.md all take their words from here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    id: str
    severity: str  # critical | warning | info
    signals: str  # what is read together
    cause: str
    action: str


TABLE: list[Row] = [
    Row("reward_saturated", "warning", "correctness reward ~ its maximum over a window (groups all-correct)",
        "task too easy; the learning signal is gone", "stop early and keep the checkpoint; use harder prompts"),
    Row("signal_vanished", "warning", "frac_zero_std >= ~0.9 over a window (all-correct or all-wrong)",
        "prompts too easy or too hard for the policy; G too small", "raise G (8-16), dynamic sampling, a curriculum"),
    Row("adv_mean_drift", "critical", "per-sequence advantage mean != 0",
        "implementation bug in the advantage computation", "halt the run"),
    Row("nonfinite", "critical", "NaN/Inf in loss, reward, logits or gradients",
        "numerics (overflow, a bad batch, a bad reward function)", "skip the step; halt after N in a row"),
    Row("plateau_kl_flat", "warning", "reward slope ~ 0 early while KL ~ 0",
        "beta too large, or sampling temperature too low", "lower beta or use a KL schedule; raise the temperature"),
    Row("plateau_grader_loose", "warning", "reward high and flat, KL normal, sample_acc not rising (reward far above sample_acc)",
        "verifier too loose: 'just hitting' the format is rewarded", "tighten the verifier; multi-condition or partial credit"),
    Row("plateau_small_group", "warning", "reward flat and noisy (high windowed sd), G <= 4, high frac_zero_std",
        "G too small: noisy group statistics (variance of the mean ~ 1/G)", "raise G to 8-16"),
    Row("reward_hacking", "critical", "reward rising or high while sample_acc flat or falling beyond its noise",
        "the policy found a grader loophole", "audit the grader; make format rewards conditional on correctness"),
    Row("kl_runaway", "critical", "KL above its bound or growing fast while reward falls",
        "policy drifting off the reference (reins too loose, LR too high)", "raise beta, lower the LR, clip the update ratio"),
    Row("kl_dominant", "critical", "KL rising while frac_zero_std ~ 1: the KL term is the only gradient",
        "collapse mode: with no reward signal left, only the KL term moves the policy",
        "mask zero-advantage groups; length-normalise or drop the KL"),
    Row("entropy_collapse", "warning", "entropy far below its early baseline and falling, reward flat",
        "exploration lost; the model repeats itself", "raise the temperature, clip-higher, lower the LR"),
    Row("entropy_blowup", "critical", "entropy approaching ln(V), or rising sharply while reward falls; often length pinned at max",
        "generation turning random", "stop; restore the last healthy checkpoint; lower the LR or clip"),
    Row("exploration", "info", "entropy rising while reward rises and groups still carry signal",
        "healthy exploration", "none: annotate only"),
    Row("loss_spike", "warning", "loss far outside its rolling band",
        "numerics or a bad batch", "inspect the step's samples"),
    Row("kl_only_learning", "warning", "loss falling while reward flat",
        "the optimiser is only shrinking KL", "check the reward signal and beta"),
    Row("late_degradation", "critical", "reward and sample_acc both decline over a long window after their peak (fixed eval set)",
        "algorithmic instability of long runs", "stop and keep the best checkpoint; clip ratios or lower the LR"),
    Row("length_pathology", "warning", "truncation rate high (length pinned at max_new_tokens), or wrong answers growing longer than right ones",
        "length bias or runaway generation", "overlong penalty or filter; token-level loss"),
]

BY_ID = {r.id: r for r in TABLE}


OPERATIONAL = [
    ("training-stalled", "critical", "no step completed for 15 minutes (`grpo_step_last_timestamp_seconds`)",
     "a hung process, a lost GPU, a stuck data loader or reward function", "check the trainer process, its GPU and its data loader"),
    ("metrics-export-failing", "warning", "OTLP metric exports failing (`grpo_telemetry_export_failures_total`)",
     "the collector is down or unreachable; training is unaffected", "check the collector endpoint (OTEL_EXPORTER_OTLP_ENDPOINT)"),
]


def runbook_markdown() -> str:
    """docs/runbook.md, generated: `python -m telemetry.health.table > docs/runbook.md` (a test checks it)."""
    out = ["# Runbook", "",
           "Generated from `telemetry/health/table.py`; do not edit by hand. One section per health condition",
           "(the anchors that alert `runbook_url`s point at). The trainer's own detectors evaluate every row and",
           "export `grpo_health_condition{condition, severity}`; `grpo-sentinel diagnose` gives the same verdicts",
           "offline with the evidence. Read the curves together: every single curve has two opposite explanations.", ""]
    for r in TABLE:
        out += [f"## {r.id}", "", f"**Severity**: {r.severity}.", "", f"**Signals, read together**: {r.signals}.", "",
                f"**Likely cause**: {r.cause}.", "", f"**Do**: {r.action}.", ""]
        if r.id == "entropy_blowup":
            out += ["**Do not** page on entropy rising while reward rises and groups still carry signal: that is "
                    "healthy exploration (`exploration`, info only).", ""]
        if r.id == "signal_vanished":
            out += ["**Do not** read `adv_std` for this: under group normalisation it never exceeds 1; "
                    "`frac_zero_std` (and its all-correct / all-wrong split) is the gauge.", ""]
    for anchor, severity, signals, cause, action in OPERATIONAL:
        out += [f"## {anchor}", "", f"**Severity**: {severity}.", "", f"**Signal**: {signals}.", "",
                f"**Likely cause**: {cause}.", "", f"**Do**: {action}.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(runbook_markdown(), end="")
