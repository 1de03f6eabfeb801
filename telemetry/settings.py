"""The telemetry half of the run config: metrics, health, traces. Typed and validated once, before
anything heavy loads. `service/config.py` composes these into the run's one config; they live here
because telemetry is also attached to trainers that are not ours (the TRL callback), and telemetry
never imports the service.
"""

from __future__ import annotations

import difflib
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Section(BaseModel):
    # NaN and infinities are never a setting: JSON's NaN/Infinity literals and YAML's .nan/.inf are refused.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def error_lines(errors: list[dict], root: type[BaseModel]) -> list[str]:
    """Pydantic's errors of a `root` model, one line each: the field path, the problem, and for a
    misspelt key the nearest valid one (the service's config and the TRL callback's options)."""
    lines = []
    for err in errors:
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key{_did_you_mean(err['loc'], root)}"
        elif "input" in err and err["type"] not in ("missing",) and not isinstance(err["input"], dict):
            msg += f" (got {_short(repr(err['input']))})"
        lines.append(f"{loc}: {msg}")
    return lines


def _short(text: str, limit: int = 80) -> str:
    """An echoed input, cut: a message repeats what was wrong, not a whole (possibly huge) value."""
    return text if len(text) <= limit else f"{text[:limit - 15]}... ({len(text)} chars)"


def _did_you_mean(loc: tuple, model: type[BaseModel]) -> str:
    """Walk the model tree along `loc` to the section that rejected the key; suggest its nearest field."""
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        ann = model.model_fields[part].annotation
        ann = getattr(ann, "__args__", (ann,))[0] if getattr(ann, "__origin__", None) is list else ann
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return ""
        model = ann
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else f" (valid keys: {', '.join(model.model_fields)})"


class TelemetrySettings(Section):
    prometheus: bool = Field(True, description="Serve OpenTelemetry metrics at http://<host>:<port>/metrics for Prometheus.")
    prometheus_host: str = Field("127.0.0.1", description="Bind address; 0.0.0.0 to be scraped from other hosts (e.g. in a pod).")
    prometheus_port: int = Field(9464, ge=0, le=65535, description="Port; 0 picks a free one (logged at start).")
    linger_s: float = Field(
        0.0, ge=0, description="Keep /metrics up this long after the run ends, so a last scrape sees the final step."
    )
    otlp_export_interval_s: float = Field(
        10.0,
        gt=0,
        description="Push interval when OTEL_EXPORTER_OTLP_ENDPOINT is set (protocol per OTEL_EXPORTER_OTLP_PROTOCOL).",
    )


class HealthSettings(Section):
    enabled: bool = Field(True, description="Evaluate the health table while training (log events, metrics, actions).")
    window: int | None = Field(
        None, ge=2, description="Detector window in steps; default: enough steps for ~400 completions (5..100)."
    )
    stop_on: list[str] = Field(default_factory=lambda: ["reward_saturated"],
                               description="Conditions that end the run early as a success (checkpoint kept).")
    halt_on: list[str] = Field(default_factory=lambda: ["adv_mean_drift"],
                               description="Conditions that halt the run as broken (exit 3).")
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="Detector thresholds changed from their defaults (telemetry/health/thresholds.py), e.g. "
                    "{forecast_windows: 5}; kept in run.json, so `diagnose` judges the run the same. Give the alert "
                    "rules the same (`grpo-sentinel rules --set NAME=VALUE`).",
    )

    @field_validator("thresholds")
    @classmethod
    def _known_thresholds(cls, v: dict[str, float]) -> dict[str, float]:
        from grpo_sentinel.telemetry.health.thresholds import coerce

        for name, value in v.items():
            if name == "window":
                raise ValueError("the detector window is health.window, not a threshold")
            coerce(name, value)  # a known name (or the nearest one said), inside its domain
        return v

    @field_validator("stop_on", "halt_on")
    @classmethod
    def _known_conditions(cls, v: list[str]) -> list[str]:
        from grpo_sentinel.telemetry.health.table import BY_ID

        for cid in v:
            if cid not in BY_ID:
                close = difflib.get_close_matches(cid, BY_ID, n=1)
                raise ValueError(f"unknown condition {cid!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        return v


class TracesSettings(Section):
    """Langfuse traces of the generations. Keys and host come only from the environment
    (LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY, LANGFUSE_BASE_URL or LANGFUSE_HOST): never from a file."""

    enabled: bool = Field(True, description="Send traces when the Langfuse keys are set in the environment; false: never.")
    train_every: int = Field(5, gt=0, description="Trace training rollouts every N steps (and at every step a health "
                                                  "condition begins).")
    train_fraction: float = Field(0.125, gt=0, le=1, description="Fraction of a traced step's groups that are traced "
                                                                 "(at least one); the groups explaining an active "
                                                                 "condition are always added.")
    eval_prompts: int = Field(32, gt=0, description="Held-out prompts traced per round: the first N of the fixed "
                                                    "held-out set, the same ones every round, so each one's answers "
                                                    "can be followed through training (sample_acc is measured on all).")
    sample_rate: float = Field(1.0, gt=0, le=1, description="Fraction of the other traces kept (held-out rounds and "
                                                            "sampled groups), chosen by trace id; explaining groups are "
                                                            "always kept.")
    max_chars: int = Field(2000, gt=0, description="Longest prompt or completion text sent; longer ones are cut, with "
                                                   "the number of characters cut said.")
    mask: list[str] = Field(default_factory=list, description="Regular expressions replaced by [REDACTED] in every "
                                                              "text before it leaves the process (the SDK's mask).")
    project_id: str | None = Field(None, description="Langfuse project id, for links to traces (default: "
                                                     "LANGFUSE_PROJECT_ID). Without it the record keeps trace ids only.")
    dashboard_url: str | None = Field(None, description="Grafana base URL; each trace links the run's dashboard "
                                                        "(default: GRPO_SENTINEL_GRAFANA_URL).")
    flush_timeout_s: float = Field(5.0, gt=0, description="Longest wait for pending traces at a checkpoint and at the end.")

    @field_validator("mask")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for pattern in v:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"mask {pattern!r} is not a regular expression ({e})") from None
        return v
