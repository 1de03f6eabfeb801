"""The alert rules agree with `grpo-sentinel diagnose`: every scenario of the diagnosis zoo, one
step per 15 s scrape, is fed to `promtool test rules`; for every row PromQL can express, the alerts
that ever fire are exactly the conditions the offline diagnosis reports.

At 15 s a step the default 5 min window is the detectors' default 20 steps, so the rules are the
committed defaults except `for:` (a paging delay, not part of a condition), which is 0 here, and
`max_reward`, which is each scenario's own (a format reward makes it 2). The entropy baseline the
trainer exports (`grpo_entropy_baseline`) is the diagnosis's own. Every series carries its run's
run_id, as the exporter writes it, and a dozen runs share one promtool group, as runs share one
Prometheus: the alerts are compared run by run.
"""

import subprocess

import numpy as np
import pytest
import yaml

import zoo
from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.health.rules import TRAINER_SIDE, RuleParams, alert_name, render
from grpo_sentinel.telemetry.health.runlog import RunLog
from grpo_sentinel.telemetry.health.table import BY_ID, TABLE
from grpo_sentinel.telemetry.health.thresholds import Thresholds

STEP_S = 15
COMPLETIONS = zoo.P * zoo.G  # per step, every scenario


def _values(x: np.ndarray) -> str:
    """promtool's sample notation, one value per step. A gauge skips non-finite values, so a scrape
    shows the last value it was set to ('_' before the first)."""
    ok = np.isfinite(x)
    last = np.maximum.accumulate(np.where(ok, np.arange(len(x)), -1))
    return " ".join("_" if i < 0 else f"{x[i]:.6g}" for i in last)


def input_series(log: RunLog, entropy_baseline: float, run_id: str = "zoo") -> list[dict]:
    """What the trainer's /metrics would show, scraped once per step."""
    s, n, g = log.series, len(log), log.group_size
    acc = s["train_acc"]
    out = {
        "grpo_step": s["step"], "grpo_reward_mean": s["reward"], "grpo_kl_mean": s["kl"], "grpo_loss": s["loss"],
        "grpo_entropy_mean": s["entropy"], "grpo_entropy_normalized": s["entropy"] / log.ln_vocab,
        "grpo_entropy_baseline": np.full(n, entropy_baseline), "grpo_advantage_mean": s["adv_mean"],
        'grpo_frac_zero_std{outcome="any"}': s["frac_zero_std"], "grpo_train_accuracy": acc,
        "grpo_truncation_rate": s["truncation_rate"], "grpo_group_size": np.full(n, g),
        **({"grpo_repetition_rate": s["repetition"]} if log.has("repetition") else {}),
        # counters: cumulative sums of per-step increments
        'grpo_updates_skipped_total{reason="nonfinite"}': np.cumsum(s["_nonfinite"]),
    }
    for correct, share, length in (("true", acc, s["response_len_correct"]), ("false", 1 - acc, s["response_len_wrong"])):
        count = COMPLETIONS * share
        out[f'grpo_completion_length_count{{correct="{correct}"}}'] = np.cumsum(count)
        out[f'grpo_completion_length_sum{{correct="{correct}"}}'] = np.cumsum(np.nan_to_num(count * length))
    series = []
    for name, values in out.items():
        metric, _, labels = name.partition("{")
        labels = (f'job="grpo",instance="zoo",run_id="{run_id}",' + labels.rstrip("}")).rstrip(",")
        series.append({"series": f"{metric}{{{labels}}}", "values": _values(np.asarray(values, dtype=float))})
    return series


CASES = [(gen, seed) for gen in zoo.ZOO for seed in (0, 1)]


def promtool_case(log: RunLog, name: str, run_id: str) -> tuple[dict, set[str]]:
    """A `promtool test rules` case: the log's series, and the alerts that must have fired by its end,
    exactly the conditions diagnose finds (the trainer-side ones aside); and those conditions."""
    diagnosis = diagnose(log)
    found = {c.id for c in diagnosis.conditions} - set(TRAINER_SIDE)
    # A drift row's critical stages (label stage="escalated", "forecast") fire exactly where diagnose raises
    # them; the evidence says which (detectors._escalate).
    staged = [c for c in diagnosis.conditions if c.severity == "critical" and BY_ID[c.id].severity == "warning"
              and c.id not in TRAINER_SIDE]
    stages = {(c.id, "forecast" if "; forecast: " in c.evidence else "escalated") for c in staged}
    end = (len(log) - 1) * STEP_S
    return {
        "name": f"{name}: diagnose reports {sorted(found) or 'nothing'}",
        "interval": f"{STEP_S}s",
        "input_series": input_series(log, diagnosis.entropy_baseline, run_id),
        "promql_expr_test": [{
            "expr": f'group by (run_id, alertname, stage) (max_over_time(ALERTS{{alertstate="firing"}}[{end + STEP_S}s]))',
            "eval_time": f"{end}s",
            "exp_samples": [{"labels": f'{{run_id="{run_id}", alertname="{alert_name(c)}"}}', "value": 1} for c in sorted(found)]
            + [{"labels": f'{{run_id="{run_id}", alertname="{alert_name(c)}", stage="{stage}"}}', "value": 1}
               for c, stage in sorted(stages)],
        }],
    }, found


# promtool's query engine refuses a query that loads more than its sample limit: the long-range rules over the 72
# runs at once did; 12 runs a group pass.
RUNS_A_GROUP = 12


def one_scrape(cases: list[dict]) -> dict:
    """Runs of the same length as one Prometheus holds them, each its own run_id: one promtool group, so every
    rule is evaluated once a step over all of them (as in production, where one Prometheus scrapes many runs;
    a rule that mixed runs would fail here), instead of once a step per run."""
    tests = [c["promql_expr_test"][0] for c in cases]
    assert len({(t["expr"], t["eval_time"]) for t in tests}) == 1, "runs of different lengths: separate groups"
    return {"name": f"{len(cases)} runs: " + ", ".join(c["name"] for c in cases), "interval": cases[0]["interval"],
            "input_series": [s for c in cases for s in c["input_series"]],
            "promql_expr_test": [{**tests[0], "exp_samples": [e for t in tests for e in t["exp_samples"]]}]}


@pytest.mark.slow
def test_promql_alerts_equal_the_diagnosis_on_the_zoo(tmp_path, promtool):
    tests, expected_any = {}, set()
    for gen, seed in CASES:
        log = zoo.make(gen, seed)
        case, found = promtool_case(log, f"{gen.__name__} seed {seed}", f"{gen.__name__}-{seed}")
        expected_any |= found
        tests.setdefault(log.max_reward, []).append(case)
    runs = []
    for max_reward, cases in tests.items():
        rules = f"rules-{max_reward:g}.yml"
        (tmp_path / rules).write_text(render(RuleParams(window=Thresholds().window * STEP_S, pending=0, max_reward=max_reward)))
        groups = [one_scrape(cases[i : i + RUNS_A_GROUP]) for i in range(0, len(cases), RUNS_A_GROUP)]
        for half in (0, 1):  # two promtool processes per rules file: the machine has two cores
            if groups[half::2]:
                name = f"agreement-{max_reward:g}-{half}.test.yml"
                (tmp_path / name).write_text(yaml.safe_dump(
                    {"rule_files": [rules], "evaluation_interval": f"{STEP_S}s", "tests": groups[half::2]}, width=1 << 20))
                runs.append(subprocess.Popen([promtool, "test", "rules", name], cwd=tmp_path, text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for run in runs:
        out = run.communicate()[0]
        assert run.returncode == 0, out[-20000:]
    # The comparison covers the PromQL rows, not just the quiet ones.
    promql_rows = {r.id for r in TABLE} - set(TRAINER_SIDE)
    assert expected_any == promql_rows, promql_rows - expected_any  # every PromQL row fires somewhere in the zoo
    assert len(promql_rows) == 17
