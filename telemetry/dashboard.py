"""The Grafana dashboards, as code: grafana/dashboards/grpo-health.json (one run's health) and
grafana/dashboards/grpo-service.json (the daemon: its runs, its queue, the alerts of each run), written
by `grpo-sentinel generate`; `grpo-sentinel dashboard [health|service] --set ...` prints them for
another monitoring config (telemetry/monitoring.py: selector, window). Tests run every query against
a real Prometheus scraping a real trainer (the run's) and a real daemon training two runs (the service's).

Built with grafana-foundation-sdk (typed builders for the Grafana 10.1 schema). Panels read the
exported series as docs/metrics.md names them; each description says how to read the panel, in
the health table's words (monitoring.PANEL_ROWS says which rows a panel shows). Moving averages use
`$window`, whose default is the alert rules' window.
"""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, statetimeline, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.monitoring import HEALTH_UID, PANEL_ROWS, Monitoring, duration, series, with_settings

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every query's selector, after the monitoring config's own (Monitoring.selector): the run chosen
# above. Every exported series carries the run id as its run_id label, so consecutive runs of one
# trainer (the daemon runs many on one pod) never mix, and a resumed run that came back on another
# pod is still one run: no instance selector is needed.
RUN = 'job=~"$job", run_id="$run"'

# Where the run's generations open in Langfuse: the trace exporter uses the run id as the Langfuse
# session id, so the session page lists every traced generation of the run.
LANGFUSE = "${langfuse_url}/project/${langfuse_project}/sessions/${run:percentencode}"
RUN_LINK = db.DashboardLink("Generations of run ${run} in Langfuse (its session)").url(LANGFUSE)


def _q(expr: str, legend: str = "", fmt: PromQueryFormat | None = None) -> prometheus.Dataquery:
    q = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").range()
    return q.format(fmt) if fmt else q


def _sel(m: Monitoring, metric: str, extra: str = "") -> str:
    return series(m, metric, RUN + (f", {extra}" if extra else ""))


def _ma(m: Monitoring, metric: str, extra: str = "") -> str:
    return f"avg_over_time({_sel(m, metric, extra)}[$window])"


def _described(title: str, description: str) -> str:
    """The description and the 'read with' lines of the health-table rows the panel shows
    (monitoring.PANEL_ROWS): what each pattern on it means."""
    rows = PANEL_ROWS.get(title, ())
    return " ".join([description, *(f"{BY_ID[r].signals} -> {r} ({BY_ID[r].severity}: {BY_ID[r].action})."
                                    for r in rows)])


def _timeseries(title: str, description: str, targets: list, unit: str = "none", lo: float | None = None,
                hi: float | None = None, w: int = 12, links: tuple = (RUN_LINK,)) -> timeseries.Panel:
    p = (timeseries.Panel().title(title).description(_described(title, description)).datasource(DS).unit(unit).span(w).height(8)
         .line_width(1).fill_opacity(0).show_points(common.VisibilityMode.NEVER)
         .legend(cb.VizLegendOptions().show_legend(True).display_mode(common.LegendDisplayMode.LIST)
                 .placement(common.LegendPlacement.BOTTOM))
         .tooltip(cb.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.NONE))
         .data_links(list(links)))
    if lo is not None:
        p = p.min(lo)
    if hi is not None:
        p = p.max(hi)
    for i, t in enumerate(targets):
        p = p.with_target(t.ref_id(chr(65 + i)))
    return p


def _heatmap(m: Monitoring, title: str, metric: str, description: str, unit: str = "none",
             per: str = "completions") -> heatmap.Panel:
    expr = f"sum by (le) (rate({_sel(m, metric + '_bucket')}[$__rate_interval]))"
    return (heatmap.Panel().title(title).description(f"{description} Colour: {per} per second in each bucket.")
            .datasource(DS).span(8).height(8).calculate(False)
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges").steps(64))
            .y_axis(heatmap.YAxisConfig().unit(unit))
            .with_target(_q(expr, "{{le}}", PromQueryFormat.HEATMAP).ref_id("A")))


def _lanes(active: str) -> list[dm.ValueMap]:
    """Condition lanes: green while it does not hold, `active` while it does (info rows are blue: healthy)."""
    return [dm.ValueMap(options={"0": dm.ValueMappingResult(text="ok", color="green"),
                                 "1": dm.ValueMappingResult(text="active", color=active)})]


def _stat(title: str, description: str, expr: str, unit: str = "none", legend: str = "") -> stat.Panel:
    return (stat.Panel().title(title).description(_described(title, description)).datasource(DS).unit(unit).span(4).height(4)
            .graph_mode(common.BigValueGraphMode.AREA)
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]))
            .with_target(_q(expr, legend).ref_id("A")))


def panels(m: Monitoring = Monitoring()) -> list[tuple[str, list]]:
    """(row title, panels), top to bottom: verdict first, then the curves that explain it."""
    conditions = (statetimeline.Panel().title("Health conditions (trainer's monitor)").datasource(DS).span(24).height(10)
                  .description("One lane per health-table row, red while the trainer's monitor finds it: the same verdicts "
                               "as `grpo-sentinel diagnose`. Alerts GRPO<Condition> page on these or on their PromQL "
                               "versions (docs/runbook.md says which); all green is a healthy run.")
                  .show_value(common.VisibilityMode.NEVER).merge_values(True).row_height(0.8)
                  .mappings(_lanes("red"))
                  .override_by_regexp(r".*\(info\)", [dm.DynamicConfigValue("mappings", _lanes("blue"))])
                  .with_target(_q(f"max by (condition, severity) ({_sel(m, 'grpo_health_condition')})",
                                  "{{condition}} ({{severity}})").ref_id("A")))
    overview = [
        conditions,
        _stat("Step", "The last completed optimizer step.", f"max({_sel(m, 'grpo_step')})"),
        _stat("Tokens / s", "Completion tokens generated per second of step time (last step).",
              f"max({_sel(m, 'grpo_tokens_per_second')})"),
        _stat("Steps / min", "Optimizer steps per minute over $window; 0 while stalled (GRPOTrainingStalled).",
              f"60 * sum(rate({_sel(m, 'grpo_steps_total')}[$window]))"),
        _stat("Step time p95", "95th percentile of the step wall time over $window.",
              f"histogram_quantile(0.95, sum by (le) (rate({_sel(m, 'grpo_step_duration_seconds_bucket')}[$window])))", "s"),
        _stat("Skipped updates", "Updates skipped (non-finite loss/gradients, or no scored sample) in the range.",
              f"sum(increase({_sel(m, 'grpo_updates_skipped_total')}[$__range]))"),
        _stat("Invalid rewards", "Reward calls that raised or returned None/NaN/inf in the range.",
              f"sum(increase({_sel(m, 'grpo_reward_invalid_total')}[$__range])) or vector(0)"),
    ]
    reward = [
        _timeseries(
            "Reward",
            "Mean combined reward per step and its $window moving average. Never read it alone:",
            [_q(_sel(m, "grpo_reward_mean"), "reward"), _q(_ma(m, "grpo_reward_mean"), "moving mean")],
        ),
        _timeseries(
            "Held-out accuracy vs reward",
            "sample_acc on the fixed held-out set (sampled and greedy) against the reward and the verifier's "
            "acceptance of the training completions.",
            [
                _q(_sel(m, "grpo_sample_acc"), "sample_acc {{mode}}"),
                _q(_ma(m, "grpo_reward_mean"), "reward (moving mean)"),
                _q(_ma(m, "grpo_train_accuracy"), "train accuracy (moving mean)"),
            ],
            lo=0,
        ),
        _timeseries(
            "Groups without signal",
            "Fraction of groups whose rewards are all equal (no gradient), split into all-correct and all-wrong.",
            [
                _q(_sel(m, "grpo_frac_zero_std"), "{{outcome}}"),
                _q(_ma(m, "grpo_frac_zero_std", 'outcome="any"'), "any (moving mean)"),
            ],
            "percentunit",
            0,
            1,
        ),
    ]
    kl_loss = [
        _timeseries("KL to the reference", "Token-mean k3 KL per step and its moving mean (absent when beta = 0).",
                    [_q(_sel(m, "grpo_kl_mean"), "kl"), _q(_ma(m, "grpo_kl_mean"), "moving mean")]),
        _timeseries("Loss", "The loss actually back-propagated; exactly 0 on a step without signal.",
                    [_q(_sel(m, "grpo_loss"), "loss"), _q(_ma(m, "grpo_loss"), "moving mean")]),
        _timeseries("Gradient norm", "Total gradient norm before clipping.",
                    [_q(_sel(m, "grpo_grad_norm"), "grad norm"), _q(_ma(m, "grpo_grad_norm"), "moving mean")]),
        _timeseries("Ratio clip", "Fraction of tokens where the ratio clip was active (both sides; the trainer's monitor "
                    "reads the upper and lower sides apart).",
                    [_q(_sel(m, "grpo_clip_fraction"), "clipped"), _q(_ma(m, "grpo_clip_fraction"), "moving mean")],
                    "percentunit", 0),
    ]
    entropy = [
        _timeseries("Entropy", "Token-mean entropy (nats, un-tempered), its moving mean and the run's early baseline "
                    "(what the entropy rows compare with).",
                    [_q(_sel(m, "grpo_entropy_mean"), "entropy"), _q(_ma(m, "grpo_entropy_mean"), "moving mean"),
                     _q(_sel(m, "grpo_entropy_baseline"), "early baseline")]),
        _timeseries("Entropy / ln V", "Entropy as a fraction of the uniform distribution's (1 = random text).",
                    [_q(_sel(m, "grpo_entropy_normalized"), "entropy / ln V")], "percentunit", 0, 1),
    ]
    advantages = [
        _timeseries("Advantage mean", "Must sit at 0 within float rounding: anything else is a bug.",
                    [_q(_sel(m, "grpo_advantage_mean"), "mean")]),
        _timeseries("Advantage std", "Unbiased std of advantages; at most 1 under group scaling, lower when many groups "
                    "carry no signal (read the zero-signal panel, not this, for signal_vanished).",
                    [_q(_sel(m, "grpo_advantage_std"), "std"), _q(_ma(m, "grpo_advantage_std"), "moving mean")]),
    ]
    lengths = [
        _timeseries("Completion length", "Mean tokens per completion, right vs wrong answers (every completion counts).",
                    [_q(f"sum by (correct) (rate({_sel(m, 'grpo_completion_length_sum')}[$window])) / "
                        f"sum by (correct) (rate({_sel(m, 'grpo_completion_length_count')}[$window]))", "correct={{correct}}")]),
        _timeseries("Truncation", "Fraction of completions that hit max_new_tokens, and its moving mean.",
                    [_q(_sel(m, "grpo_truncation_rate"), "truncated"), _q(_ma(m, "grpo_truncation_rate"), "moving mean")],
                    "percentunit", 0, 1),
        _timeseries("Repetition", "Mean over completions of the share of a completion's word 4-grams that repeat an "
                    "earlier one (seq-rep-4).",
                    [_q(_sel(m, "grpo_repetition_rate"), "repeated 4-grams"), _q(_ma(m, "grpo_repetition_rate"), "moving mean")],
                    "percentunit", 0, 1),
    ]
    mismatch = [
        _timeseries("Train/inference mismatch", "Token-mean k3 KL between the sampler's and the trainer's log-probs of "
                    "the sampled tokens (~1e-13 when both are float32 forwards of the same weights, 1e-4 to 1e-3 for a bf16 "
                    "sampler), and its moving mean.",
                    [_q(_sel(m, "grpo_mismatch_kl"), "mismatch KL"), _q(_ma(m, "grpo_mismatch_kl"), "moving mean")],
                    w=8),
        _timeseries("Log-prob gap", "Mean and largest |log p_trainer - log p_sampler| of the step's tokens.",
                    [_q(_sel(m, "grpo_mismatch_logp_diff_mean"), "mean"), _q(_sel(m, "grpo_mismatch_logp_diff_max"), "max")],
                    w=8),
        _timeseries("Importance ratio", "p_trainer / p_sampler per token before any correction (1 where they agree), "
                    "and the share of tokens grpo.is_correction truncated or masked.",
                    [_q(f"max by (stat) ({_sel(m, 'grpo_importance_ratio')})", "{{stat}}"),
                     _q(_sel(m, "grpo_importance_masked_fraction"), "masked or truncated")], w=8),
    ]
    distributions = [
        _heatmap(m, "Reward distribution", "grpo_reward", "Per-completion reward: a healthy run moves mass upwards while "
                 "keeping spread within groups."),
        _heatmap(m, "KL distribution", "grpo_kl", "Per-completion k3 KL: a long right tail is a few completions running "
                 "off the reference before the mean shows it."),
        _heatmap(m, "Entropy distribution", "grpo_entropy", "Per-completion entropy (nats): mass collapsing to 0 is "
                 "repetition; mass moving towards ln V is random text."),
        _heatmap(m, "|Advantage| distribution", "grpo_advantage_abs", "abs(advantage): mass at 0 is groups without signal."),
        _heatmap(m, "Group reward std", "grpo_group_reward_std", "Per-group reward std: the lowest bucket is groups that "
                 "teach nothing.", per="groups"),
        _heatmap(m, "Completion length", "grpo_completion_length", "Tokens per completion: mass pinned at the top bucket "
                 "is truncation."),
    ]
    throughput = [
        _timeseries(
            "Throughput",
            "Completion tokens per second of step time, and steps per minute.",
            [
                _q(_sel(m, "grpo_tokens_per_second"), "tokens/s"),
                _q(f"60 * sum(rate({_sel(m, 'grpo_steps_total')}[$window]))", "steps/min"),
            ],
        ),
        _timeseries(
            "Step time",
            "Step wall time quantiles (rollout to optimizer step) over $window.",
            [
                _q(
                    f"histogram_quantile({q}, sum by (le) (rate({_sel(m, 'grpo_step_duration_seconds_bucket')}[$window])))",
                    f"p{int(q * 100)}",
                )
                for q in (0.5, 0.95)
            ],
            "s",
        ),
        _timeseries(
            "Telemetry health",
            "Failed OTLP exports, rejected histogram values, steps the metrics queue "
            "dropped and Langfuse spans and scores not delivered, per $window (GRPOMetricsExportFailing and "
            "GRPOTracesDropped page on them).",
            [
                _q(
                    f"sum by (exporter) (increase({_sel(m, 'grpo_telemetry_export_failures_total')}[$window]))",
                    "export failures {{exporter}}",
                ),
                _q(
                    f"sum(increase({_sel(m, 'grpo_histogram_rejected_total')}[$window])) or vector(0)",
                    "rejected histogram values",
                ),
                _q(
                    f"sum by (signal, reason) (increase({_sel(m, 'grpo_traces_dropped_total')}[$window]))",
                    "traces dropped: {{signal}} {{reason}}",
                ),
            ],
        ),
    ]
    ranks = [
        _timeseries("Busy time per rank", "Each training process's step time minus its wait in collectives, moving "
                    "mean over $window: the ranks should overlap. One line far above the others is a straggler "
                    "(GRPORankStraggler): the others wait for it every step.",
                    [_q(f"avg_over_time({_sel(m, 'grpo_rank_step_time_seconds')}[$window]) - "
                        f"avg_over_time({_sel(m, 'grpo_rank_collective_wait_seconds')}[$window])", "rank {{rank}}")], "s"),
        _timeseries("Wait in collectives per rank", "Time each rank waited for the others (and the transfer) per step: "
                    "the fastest ranks wait longest.",
                    [_q(_sel(m, "grpo_rank_collective_wait_seconds"), "rank {{rank}}")], "s"),
        _timeseries("Peak memory per rank", "The CUDA allocator's peak (CPU: the process's peak resident set).",
                    [_q(_sel(m, "grpo_rank_peak_memory_bytes"), "rank {{rank}}")], "bytes"),
    ]
    return [("Health", overview), ("Reward and signal", reward), ("KL and loss", kl_loss), ("Entropy", entropy),
            ("Advantages", advantages), ("Lengths", lengths), ("Sampler vs trainer", mismatch), ("Distributions", distributions),
            ("Throughput", throughput),
            ("Ranks", ranks)]


def _common_variables(m: Monitoring) -> tuple[list, list]:
    """(the data source, the moving-average window and Langfuse's address): both dashboards ask them."""
    return ([db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")], [
        db.CustomVariable("window").label("Moving average").values(",".join(_windows(m.window)))
        .description(f"Window of the moving means; {duration(m.window)} is the alert rules' default window."),
        db.TextBoxVariable("langfuse_url").label("Langfuse").default_value("http://langfuse:3000")
        .description("Base URL of the Langfuse the trainer sends generations to (panel data links open there)."),
        db.TextBoxVariable("langfuse_project").label("Langfuse project").default_value("grpo-sentinel")
        .description("Langfuse project id: the data links open the run's session (session id = run id) in it."),
    ])


def _windows(rules: int) -> list[str]:
    """The moving-average choices, the rules' window first (the default): 300 -> 5m, 1m, 2m, 10m, 30m, 1h."""
    w = duration(rules)
    return [w, *(x for x in ("1m", "2m", "5m", "10m", "30m", "1h") if x != w)]


def variables(m: Monitoring = Monitoring()) -> list:
    source, common = _common_variables(m)
    return [
        *source,
        db.QueryVariable("job")
        .label("Job")
        .datasource(DS)
        .query("label_values(" + series(m, "target_info", 'service_name="grpo-sentinel"') + ", job)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED),
        db.QueryVariable("run")
        .label("Run")
        .datasource(DS)
        .query("label_values(" + series(m, "grpo_step", 'job=~"$job"') + ", run_id)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .description(
            "The run id (grpo.run_id, the run_id label of every series): one run, on whichever trainers it ran."
        ),
        *common,
    ]


# --- the service dashboard: the daemon's runs ----------------------------------------------------------

DAEMON = 'job=~"$job"'  # the daemon's pods; its runs are told apart by run_id
# Each run's own dashboard and its generations, from a table row or a series of that run.
RUN_DASHBOARD = f"/d/{HEALTH_UID}" + "?var-job=${job:queryparam}&var-run=${__data.fields.run_id:percentencode}"
RUN_GENERATIONS = "${langfuse_url}/project/${langfuse_project}/sessions/${__data.fields.run_id:percentencode}"
SERIES_DASHBOARD = f"/d/{HEALTH_UID}" + "?var-job=${job:queryparam}&var-run=${__field.labels.run_id:percentencode}"
SERIES_GENERATIONS = "${langfuse_url}/project/${langfuse_project}/sessions/${__field.labels.run_id:percentencode}"
SERIES_LINKS = (db.DashboardLink("Health of run ${__field.labels.run_id}").url(SERIES_DASHBOARD),
                db.DashboardLink("Generations of run ${__field.labels.run_id} in Langfuse").url(SERIES_GENERATIONS))
FINISHED_BADLY = 'status=~"failed|halted|preempted"'
HEALTH_LEVELS = [dm.ValueMap(options={"0": dm.ValueMappingResult(text="healthy", color="green"),
                                      "1": dm.ValueMappingResult(text="warning", color="orange"),
                                      "2": dm.ValueMappingResult(text="critical", color="red")})]


def _d(m: Monitoring, metric: str, extra: str = "") -> str:
    return series(m, metric, DAEMON + (f", {extra}" if extra else ""))


def _worst_condition(m: Monitoring) -> str:
    """Per run: 2 while a critical condition holds, 1 while only a warning does, else 0 (a run exports
    every condition, active or not; `or` adds the warnings' series, which carry other labels)."""
    critical = _d(m, "grpo_health_condition", 'severity="critical"')
    warning = _d(m, "grpo_health_condition", 'severity="warning"')
    return f"max by (run_id) (\n  2 * {critical}\n  or {warning}\n)"


def service_panels(m: Monitoring = Monitoring()) -> list[tuple[str, list]]:
    runs = [
        _stat("Queued", "Runs waiting for the trainer (POST /v1/runs queues them; one trains at a time).",
              "sum(" + _d(m, "grpo_runs", 'status="queued"') + ")"),
        _stat("Training", "Runs training now: 1 while the daemon works, 0 while it is idle.",
              "sum(" + _d(m, "grpo_runs", 'status="running"') + ")"),
        _stat("Failed, halted, preempted", "Runs that ended badly in the range, by how: failed (the run's error in "
              "GET /v1/runs/<id>; GRPORunFailed pages), halted (a critical condition stopped it), preempted (the pod "
              "stopped; it resumes at the next start).",
              f"sum by (status) (increase({_d(m, 'grpo_runs_finished_total', FINISHED_BADLY)}[$__range]))", legend="{{status}}"),
        _timeseries("Runs by status", "The daemon's runs by status over time (grpo_runs, counted from the run "
                    "directories at every scrape): the queue draining, runs finishing, failures piling up.",
                    [_q(f"sum by (status) ({_d(m, 'grpo_runs')})", "{{status}}")], lo=0, w=24, links=()),
        _timeseries("Runs ended", "Runs that ended per $window, by how (grpo_runs_finished_total).",
                    [_q(f"sum by (status) (increase({_d(m, 'grpo_runs_finished_total')}[$window]))", "{{status}}")],
                    lo=0, w=24, links=()),
    ]
    active = [
        _timeseries("Step of each run", "The last completed step of each run: one line per run, the active one "
                    "rising. A flat line while its run trains is GRPOTrainingStalled. Click a line for its dashboard.",
                    [_q(f"max by (run_id) ({_d(m, 'grpo_step')})", "{{run_id}}")], lo=0, links=SERIES_LINKS),
        (statetimeline.Panel().title("Health of each run").datasource(DS).span(12).height(8)
         .description("Worst health-table condition the trainer's monitor finds on each run: green healthy, orange "
                      "a warning, red a critical condition (its run dashboard says which).")
         .show_value(common.VisibilityMode.NEVER).merge_values(True).mappings(HEALTH_LEVELS)
         .data_links(list(SERIES_LINKS))
         .with_target(_q(_worst_condition(m), "{{run_id}}").ref_id("A"))),
        _timeseries("Steps per minute", "Optimizer steps per minute of each run over $window.",
                    [_q(f"60 * sum by (run_id) (rate({_d(m, 'grpo_steps_total')}[$window]))", "{{run_id}}")],
                    lo=0, links=SERIES_LINKS),
    ]
    alerts = [
        _timeseries("Alerts firing", "GRPO* alerts firing, per run and alert (Prometheus's ALERTS series: the rules "
                    "of deploy/prometheus/grpo-rules.yml). An alert without a run (GRPORunFailed) is the daemon's. "
                    "Grafana-managed rules are listed under Alerting > Alert rules instead.",
                    [_q(f'count by (run_id, alertname, severity) (ALERTS{{alertstate="firing", alertname=~"GRPO.+", {DAEMON}}})',
                        "{{alertname}} {{run_id}} ({{severity}})")], lo=0, w=24, links=SERIES_LINKS),
        (table.Panel().title("Runs").datasource(DS).span(24).height(8)
         .description("Every run seen in the range with its last step: click its id for its health dashboard, or its "
                      "Generations cell for its Langfuse session.")
         .with_target(_q(f"max by (run_id) (last_over_time({_d(m, 'grpo_step')}[$__range]))", "",
                         PromQueryFormat.TABLE).instant().ref_id("A"))
         .override_by_name("run_id", [dm.DynamicConfigValue("links", [
             {"title": "Health of run ${__data.fields.run_id}", "url": RUN_DASHBOARD},
             {"title": "Generations of run ${__data.fields.run_id} in Langfuse", "url": RUN_GENERATIONS}])])
         .override_by_name("Value", [dm.DynamicConfigValue("displayName", "last step")])),
    ]
    return [("Runs", runs), ("Each run", active), ("Alerts and links", alerts)]


def service_variables(m: Monitoring = Monitoring()) -> list:
    source, common = _common_variables(m)
    return [*source, db.QueryVariable("job").label("Job").datasource(DS).query(f"label_values({series(m, 'grpo_runs')}, job)")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .description("The daemon's scrape job (its pods: grpo_runs is the daemon's own series)."), *common]


def _board(d: db.Dashboard, rows: list[tuple[str, list]]) -> dict:
    for title, row in rows:
        d = d.with_row(db.Row(title))
        for p in row:
            d = d.with_panel(p)
    board = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    for v in board["templating"]["list"]:
        del v["id"]  # the SDK gives every variable the same zero UUID; Grafana keys variables by it
    for i, panel in enumerate(board["panels"], 1):  # stable ids: links to a panel (viewPanel=) survive re-imports
        panel["id"] = i
    return board


def build(m: Monitoring = Monitoring()) -> dict:
    return _board(db.Dashboard("GRPO training health").uid(HEALTH_UID).tags(["grpo", "grpo-sentinel"]).editable()
                  .description("grpo-sentinel: the health table on a live GRPO run. Generated by telemetry/dashboard.py.")
                  .tooltip(dm.DashboardCursorSync.CROSSHAIR).time("now-6h", "now").refresh("30s")
                  .variables(variables(m)), panels(m))


def build_service(m: Monitoring = Monitoring()) -> dict:
    return _board(db.Dashboard("GRPO service").uid("grpo-service").tags(["grpo", "grpo-sentinel"]).editable()
                  .description("grpo-sentinel's daemon: its runs by status, the queue, each run's step and health, the "
                               "alerts firing per run, and links to each run's dashboard (grpo-health) and generations. "
                               "Generated by telemetry/dashboard.py.")
                  .tooltip(dm.DashboardCursorSync.CROSSHAIR).time("now-24h", "now").refresh("30s")
                  .variables(service_variables(m)), service_panels(m))


BOARDS = {"health": build, "service": build_service}


def render(name: str = "health", m: Monitoring = Monitoring()) -> str:
    return json.dumps(BOARDS[name](m), indent=2, sort_keys=True) + "\n"


def command(name: str, settings: list[str]) -> int:
    """`grpo-sentinel dashboard NAME --set ...`: the dashboard for a monitoring config (as the rules take it)."""
    try:
        m = with_settings(Monitoring(), settings)
    except ValueError as e:
        print(f"grpo-sentinel dashboard: {e}", file=sys.stderr)
        return 2
    print(render(name, m), end="")
    return 0


def queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p.get("targets", [])]

