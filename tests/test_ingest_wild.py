"""Logs in the wild: KL under its common names, signed estimators, auxiliary reward columns, verl and
OpenRLHF JSONL logs, TRL's trainer_state.json; every column recognised, ignored or derived is
listed in the notes, and correctness is judged on the correctness component."""

import json

import numpy as np
import pytest

import zoo
from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.health.ingest import IngestError, load

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)


def csv_log(path, columns: dict[str, np.ndarray]) -> None:
    names = list(columns)
    n = len(next(iter(columns.values())))
    lines = [",".join(names)] + [",".join("" if not np.isfinite(columns[c][i]) else f"{columns[c][i]:.6g}" for c in names)
                                 for i in range(n)]
    path.write_text("\n".join(lines) + "\n")


def noted(log, column: str) -> bool:
    return any(column in n for n in log.notes)


@pytest.mark.parametrize("name", ["kl", "kl_loss", "objective/kl", "actor/kl_loss", "kl_div", "kl_divergence", "critic/kl"])
def test_kl_under_its_common_names(tmp_path, name):
    steps = np.arange(1, 41, dtype=float)
    csv_log(tmp_path / "m.csv", {"step": steps, "reward": np.full(40, 0.5), name: 0.01 * steps})
    log = load(tmp_path / "m.csv")
    assert log.series["kl"][-1] == pytest.approx(0.4) and not log.kl_signed
    assert name == "kl" or noted(log, f"{name} -> kl")
    assert "kl_runaway" not in diagnose(log).not_assessable


def test_policy_to_old_policy_kl_is_not_kl_to_the_reference(tmp_path):
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, 11.0), "reward": np.full(10, 0.5), "approx_kl": np.full(10, 0.2)})
    log = load(tmp_path / "m.csv")
    assert "kl" not in log.series and noted(log, "approx_kl (old-vs-new policy KL")


def test_a_signed_kl_estimator_is_kept_and_said(tmp_path):
    rng = np.random.default_rng(0)
    kl = 0.002 + 0.01 * rng.standard_normal(60)  # k1 on sequence sums: unbiased, but single steps go negative
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, 61.0), "reward": np.full(60, 0.5), "kl_loss": kl})
    log = load(tmp_path / "m.csv")
    assert log.kl_signed and noted(log, "a signed estimator (k1)")
    assert np.allclose(log.series["kl"], kl, atol=1e-6)


def test_auxiliary_rewards_never_make_a_healthy_run_look_saturated(tmp_path):
    """reward_avg = correctness (~0.5) + a format reward the policy has maxed (1.0): the combined
    reward is ~1.5 >= 0.95, and a 'reward ~ its maximum' rule on it would stop a healthy run
    (health.stop_on: [reward_saturated]). Judged on the correctness component it is not saturated."""
    rng = np.random.default_rng(1)
    n = 120
    correct = rng.binomial(64, 0.5, n) / 64
    fmt = np.ones(n)
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, n + 1.0), "reward_avg": correct + fmt,
                                 "correctness_reward_avg": correct, "format_reward_avg": fmt, "loss": np.zeros(n)})
    log = load(tmp_path / "m.csv")
    assert np.allclose(log.series["train_acc"], correct, atol=1e-6) and noted(log, "train_acc from the correctness component")
    assert np.allclose(log.series["reward_aux"], fmt) and log.max_reward == 2
    assert noted(log, "correctness_reward_avg (correctness)") and noted(log, "format_reward_avg (auxiliary)")
    assert "reward_saturated" not in {c.id for c in diagnose(log).conditions}


def test_a_combined_reward_above_one_without_components_is_not_judged_for_saturation(tmp_path):
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, 61.0), "reward": np.full(60, 1.6)})
    log = load(tmp_path / "m.csv")
    d = diagnose(log)
    assert "reward_saturated" in d.not_assessable and not d.conditions
    assert noted(log, "does not say its maximum")


def test_trl_trainer_state_with_reward_functions_and_garbage_entries(tmp_path):
    rng = np.random.default_rng(2)
    history = []
    for s in range(1, 81):
        acc = float(rng.binomial(16, 0.4) / 16)
        history.append({"step": s, "epoch": s / 80, "loss": 1e-3 * float(rng.standard_normal()), "reward": acc + 1.0,
                        "reward_std": 0.3, "rewards/accuracy_reward/mean": acc, "rewards/accuracy_reward/std": 0.4,
                        "rewards/format_reward/mean": 1.0, "kl": 0.001 * s, "entropy": 0.9,
                        "frac_reward_zero_std": 0.2, "completions/mean_length": 120.0, "completions/max_length": 256.0,
                        "completions/clipped_ratio": 0.05, "learning_rate": 1e-6, "grad_norm": 0.3})
        if s % 20 == 0:
            history.append({"step": s, "eval_accuracy": 0.4, "eval_loss": 0.1})
    history += [17, "garbage", None, {"step": "abc", "reward": 1}, {"reward": 2}, {"step": 81, "reward": "high", "kl": [1]},
                {"step": 82, "train_runtime": 9.0, "train_loss": 0.1}]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    log = load(tmp_path / "trainer_state.json")
    assert log.format == "trl" and len(log) == 82
    assert noted(log, "3 log_history entries are not objects") and noted(log, "without a numeric 'step' skipped")
    assert log.series["sample_acc"][19] == 0.4 and noted(log, "eval_accuracy -> sample_acc")
    assert noted(log, "rewards/accuracy_reward/mean (correctness)") and noted(log, "rewards/format_reward/mean (auxiliary)")
    assert log.max_reward == 2 and log.has("train_acc") and log.has("reward_aux")
    assert noted(log, "completions/clipped_ratio -> truncation_rate") and noted(log, "epoch (not a per-step signal)")
    assert "reward_saturated" not in {c.id for c in diagnose(log).conditions}


def test_verl_jsonl(tmp_path):
    rng = np.random.default_rng(3)
    lines = []
    for s in range(1, 101):
        data = {"critic/score/mean": float(rng.binomial(64, 0.5) / 64), "critic/rewards/mean": 0.5,
                "actor/kl_loss": 0.001 * s, "actor/pg_loss": 0.01 * float(rng.standard_normal()),
                "actor/entropy": 1.1, "actor/ppo_kl": 1e-4, "response_length/mean": 300.0,
                "response_length/max": 1024.0 if s % 7 == 0 else 900.0, "response_length/clip_ratio": 0.02,
                "actor/grad_norm": 0.2, "actor/lr": 1e-6, "timing_s/step": 30.0,
                "rollout_corr/k3_kl": 2e-4, "training/rollout_probs_diff_mean": 0.003}
        if s % 10 == 0:
            data["val-core/openai/gsm8k/acc/mean@1"] = 0.6
        lines.append(json.dumps({"step": s, "data": data}))
    lines.insert(5, "not json")
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    log = load(tmp_path / "metrics.jsonl")
    assert log.format == "verl" and len(log) == 100 and noted(log, "1 lines are not JSON objects")
    assert log.series["kl"][-1] == pytest.approx(0.1) and log.series["sample_acc"][9] == 0.6
    assert noted(log, "critic/score/mean -> reward") and noted(log, "actor/pg_loss -> loss")
    assert noted(log, "actor/ppo_kl (old-vs-new policy KL") and noted(log, "critic/rewards/mean (duplicate of")
    assert log.max_new_tokens == 1024 and noted(log, "max_new_tokens = 1024, inferred from response_len_max")
    # the train/inference mismatch: verl's k3 is read; its older gap in probability space is not that scale
    assert log.series["mismatch_kl"][-1] == 2e-4 and noted(log, "rollout_probs_diff_mean (verl's sampler-vs-trainer gap")


def test_openrlhf_jsonl(tmp_path):
    lines = [json.dumps({"global_step": s, "policy_loss": 0.01, "kl": 0.002 * s, "reward": 0.4, "return": 0.3,
                         "response_length": 200.0, "total_length": 400.0, "actor_lr": 5e-7,
                         **({"eval_gsm8k_pass1": 0.5} if s % 10 == 0 else {})}) for s in range(1, 51)]
    (tmp_path / "train.jsonl").write_text("\n".join(lines))
    log = load(tmp_path / "train.jsonl")
    assert log.format == "openrlhf" and log.series["sample_acc"][9] == 0.5
    assert noted(log, "global_step -> step") and noted(log, "policy_loss -> loss") and noted(log, "actor_lr -> lr")
    assert noted(log, "total_length (no row reads it)") and noted(log, "return (no row reads it)")


def test_every_column_is_accounted_for(tmp_path):
    """Each column of the log appears in the notes: read (under its own or our name), a reward
    component, or ignored with the reason."""
    cols = {"step": np.arange(1, 31.0), "reward_avg": np.full(30, 0.5), "kl_loss": np.full(30, 0.01),
            "format_reward": np.ones(30), "mystery": np.arange(30.0), "notes": np.full(30, np.nan)}
    csv_log(tmp_path / "m.csv", cols)
    log = load(tmp_path / "m.csv")
    text = " ".join(log.notes)
    assert all(c in text for c in cols), log.notes
    assert noted(log, "mystery (no row reads it)") and noted(log, "notes (no numeric value)")


def test_our_record_reads_as_before():
    log = zoo.make(zoo.healthy, 0)  # our own names pass through unchanged
    assert {"reward", "kl", "loss", "entropy", "frac_zero_std", "train_acc"} <= set(log.series)


def test_a_cap_is_inferred_only_from_a_pile_up(tmp_path):
    lengths = np.linspace(100, 500, 40)
    csv_log(tmp_path / "a.csv", {"step": np.arange(1, 41.0), "reward": np.full(40, 0.5), "response_len": lengths})
    assert load(tmp_path / "a.csv").max_new_tokens is None  # a maximum that occurs once is no ceiling
    lengths[[5, 17, 30]] = 512
    lengths = np.minimum(lengths, 512)
    csv_log(tmp_path / "b.csv", {"step": np.arange(1, 41.0), "reward": np.full(40, 0.5), "response_len": lengths})
    assert load(tmp_path / "b.csv").max_new_tokens == 512


def test_a_log_without_steps_is_read_in_row_order_and_says_so(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"reward": 1}\n{"reward": 2}\n{"reward": 0.5}\n')
    log = load(tmp_path / "x.jsonl")
    assert list(log.series["step"]) == [1, 2, 3] and list(log.series["reward"]) == [1, 2, 0.5]
    assert any("no step column" in n and "rows are numbered in order" in n for n in log.notes)


# ---------------------------------------------------------------------------------------------
# What the public logs hold (benchmarks/wild/): the keys and formats they use, read as their authors mean them.


def test_old_trl_and_unsloth_reward_keys_and_a_payout_of_two(tmp_path):
    """Up to TRL 0.16 and in Unsloth's notebooks the components are rewards/<fn> (no /mean); Unsloth's
    correctness function pays 2.0 a correct answer, so a step mean of 2/3 is 1/3 of the answers right."""
    history = [{"step": s, "reward": 1.0, "rewards/correctness_reward_func": v, "rewards/xmlcount_reward_func": 0.1}
               for s, v in enumerate([0.0, 2 / 3, 2.0, 4 / 3] * 10, start=1)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    log = load(tmp_path / "trainer_state.json")
    assert log.series["train_acc"][:4] == pytest.approx([0.0, 1 / 3, 1.0, 2 / 3])
    assert noted(log, "divided by its payout 2") and noted(log, "rewards/xmlcount_reward_func (auxiliary)")
    assert log.series["reward_aux"][0] == pytest.approx(0.1)


def test_custom_names_mean_reward_accuracy_and_rates(tmp_path):
    n = 40
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, n + 1.0), "mean_reward": np.full(n, 0.4), "accuracy": np.full(n, 0.3),
                                 "advantage/zero_rate": np.full(n, 0.2), "length/cap_hit_rate": np.full(n, 0.05)})
    log = load(tmp_path / "m.csv")
    assert {k: float(log.series[k][0]) for k in ("reward", "train_acc", "frac_zero_std", "truncation_rate")} == pytest.approx(
        {"reward": 0.4, "train_acc": 0.3, "frac_zero_std": 0.2, "truncation_rate": 0.05})


def test_roll_logs_are_read_and_their_reward_rates_are_not_summed(tmp_path):
    lines = [json.dumps({"system/step": s, "critic/score/mean": 0.5, "reward/pass_rate": 0.5, "reward/format_rate": 0.9})
             for s in range(1, 41)]
    (tmp_path / "roll.jsonl").write_text("\n".join(lines) + "\n")
    log = load(tmp_path / "roll.jsonl")
    assert log.series["step"][-1] == 40 and "reward_aux" not in log.series and "train_acc" not in log.series
    assert noted(log, "reward/format_rate (ROLL: a rate")


def test_a_column_that_is_zero_on_every_row_is_not_measured(tmp_path):
    """beta = 0: KL is logged as 0 throughout. 'KL ~ 0, lower beta' would be advice on a number nobody measured."""
    n = 120
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, n + 1.0), "reward": np.full(n, 0.5), "kl": np.zeros(n)})
    log = load(tmp_path / "m.csv")
    assert "kl" not in log.series and noted(log, "kl is exactly 0 on every row: not measured")
    diag = diagnose(log)
    assert "plateau_kl_flat" in diag.not_assessable and not any(c.id == "plateau_kl_flat" for c in diag.conditions)


def test_a_sole_component_is_the_reward_and_an_unknown_one_is_unclassified(tmp_path):
    n = 40
    csv_log(tmp_path / "a.csv", {"step": np.arange(1, n + 1.0), "reward_length": np.full(n, 0.7)})
    log = load(tmp_path / "a.csv")
    assert log.series["reward"][0] == pytest.approx(0.7) and "reward_aux" not in log.series
    assert noted(log, "sole reward component and the reward itself")
    csv_log(tmp_path / "b.csv", {"step": np.arange(1, n + 1.0), "reward": np.full(n, 1.2), "reward_gameplay": np.full(n, 0.9),
                                 "reward_format": np.full(n, 0.3)})
    log = load(tmp_path / "b.csv")
    assert noted(log, "unclassified reward components: reward_gameplay") and not log.reward_is_correctness
    assert log.series["reward_aux"][0] == pytest.approx(0.3) and "train_acc" not in log.series


def test_the_books_combined_reward_is_split(tmp_path):
    """7_6_plus_format_reward.py: reward = correctness + 1.0 x format; the log has reward_avg and
    format_reward_avg. Correctness is what is left: 1.25 - 1.0 = 0.25."""
    n = 60
    correct = np.tile([0.25, 0.5, 0.0], n // 3)
    csv_log(tmp_path / "m.csv", {"step": np.arange(1, n + 1.0), "reward_avg": correct + 1.0, "format_reward_avg": np.ones(n)})
    log = load(tmp_path / "m.csv")
    assert log.series["train_acc"] == pytest.approx(correct) and noted(log, "train_acc = reward - reward_aux")


def test_console_logs_of_trl_verl_and_step_printing_loops(tmp_path):
    trl = ["{'loss': '0.01', 'grad_norm': '0.5', 'rewards/accuracy_reward/mean': '0.25', 'reward': '0.25', 'epoch': '0.01'}",
           "  5%|#         | 2/40 [00:10<03:10,  5.0s/it]",
           "{'loss': 0.02, 'grad_norm': 0.4, 'rewards/accuracy_reward/mean': 0.5, 'reward': 0.5, 'epoch': 0.02}",
           "{'eval_loss': 0.1, 'eval_accuracy': 0.4, 'epoch': 0.02}",
           "{'train_runtime': 100.0, 'train_loss': 0.015, 'epoch': 0.02}"]
    (tmp_path / "trl.log").write_text("\n".join(trl) + "\n")
    log = load(tmp_path / "trl.log")
    assert log.format == "stdout" and log.series["step"].tolist() == [1, 2]
    assert log.series["reward"].tolist() == [0.25, 0.5] and log.series["sample_acc"].tolist()[1] == 0.4
    verl = ["(TaskRunner pid=1) step:1 - actor/pg_loss:0.1 - critic/score/mean:0.25 - response_length/mean:120.5",
            "(TaskRunner pid=1) step:2 - actor/pg_loss:-0.05 - critic/score/mean:0.375 - response_length/mean:130.0"]
    (tmp_path / "verl.log").write_text("\n".join(verl) + "\n")
    log = load(tmp_path / "verl.log")
    assert log.series["reward"].tolist() == [0.25, 0.375] and log.series["loss"].tolist() == [0.1, -0.05]
    assert log.series["response_len"].tolist() == [120.5, 130.0]
    book = [
        "[Step 1/500] loss=-0.03 reward_avg=0.125 avg_response_len=38.4",
        "[Step 2/500] loss=-0.12 reward_avg=0.25 avg_response_len=384.0",
    ]
    (tmp_path / "book.txt").write_text("\n".join(book) + "\n")
    assert load(tmp_path / "book.txt").series["reward"].tolist() == [0.125, 0.25]


def test_verl_console_as_printed(tmp_path):
    """What a verl run prints (benchmarks/wild/verl-*): the launch script and a pretty-printed config before
    step 1 (more than the sniffer's first 4 KB), numpy scalars as their repr (verl 0.4+), the validation
    summary as a dict, and the last step's validation on a line of its own with that step's number."""
    preamble = ["```", "python3 -m verl.trainer.main_ppo \\"] + [f"    data.option_{i}=value_{i} \\" for i in range(200)]
    config = ["(TaskRunner pid=7) {'actor_rollout_ref': {'actor': {'clip_ratio': 0.2,",
              "(TaskRunner pid=7)                                  'entropy_coeff': 0}}}",
              "(TaskRunner pid=7) {'type': 'fixed', 'kl_coef': 0.001}"]
    steps = [f"(TaskRunner pid=7) step:{s} - actor/pg_loss:np.float64({-0.01 * s}) - critic/score/mean:{0.1 * s}"
             f" - critic/advantages/mean:0.03 - actor/entropy:0.5" for s in (1, 2, 3)]
    tail = ["(TaskRunner pid=7) \"Final validation metrics: {'val-core/openai/gsm8k/reward/mean@1': 0.9}\"",
            "(TaskRunner pid=7) step:3 - val-core/openai/gsm8k/reward/mean@1:0.9"]
    (tmp_path / "run.log").write_text("\n".join(preamble + config + steps + tail) + "\n")
    log = load(tmp_path / "run.log")
    assert log.format == "stdout" and log.series["step"].tolist() == [1, 2, 3]  # the dicts are no rows
    assert log.series["loss"].tolist() == pytest.approx([-0.01, -0.02, -0.03])  # the number inside np.float64(...)
    assert log.series["reward"].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert np.isnan(log.series["sample_acc"][:2]).all() and log.series["sample_acc"][2] == 0.9  # joined to step 3
    # the validation summary; the config's one-line dict holds a string (not a log dict: an other line), and the
    # multi-line config is neither a dict line nor a step's
    assert noted(log, "1 printed dicts skipped") and noted(log, "1 lines joined the row of the step before them")
    assert "adv_mean" not in log.series and noted(log, "critic/advantages/mean (verl's token-weighted advantage mean")


def test_a_log_history_list_saved_on_its_own_is_read_as_trl(tmp_path):
    """json.dump(trainer.state.log_history, f): the list without trainer_state.json around it (legaloom_env)."""
    history = [{"step": s, "loss": 0.0, "reward": 0.5 + 0.01 * s, "rewards/fn": 0.1, "kl": 0.001 * s}
               for s in range(1, 41)]
    (tmp_path / "training_log.json").write_text(json.dumps(history + [{"train_runtime": 9.0, "train_loss": 0.0}]))
    log = load(tmp_path / "training_log.json")
    assert log.format == "trl" and len(log) == 40 and log.series["reward"][-1] == pytest.approx(0.9)
    assert noted(log, "a log_history list saved on its own")
    (tmp_path / "bad.json").write_text(json.dumps({"metrics": history}))
    with pytest.raises(IngestError, match="no 'log_history' list"):
        load(tmp_path / "bad.json")


def test_an_object_of_one_list_per_metric(tmp_path):
    """A hand-written loop's metrics as {"rewards_avg": [...], "kl_avg": [...]} (RL_GRPO's grpo_metrics.json):
    no step column, so rows are numbered; a value that is not one a row (a dict of evaluations) is said."""
    n = 40
    metrics = {"rewards_avg": [0.2 + 0.01 * i for i in range(n)], "train_accuracies_avg": [0.1] * n,
               "kl_avg": [0.001 * i for i in range(n)], "dev_chrf": {"10": 38.4, "20": 36.0}}
    (tmp_path / "grpo_metrics.json").write_text(json.dumps(metrics))
    log = load(tmp_path / "grpo_metrics.json")
    assert log.series["step"].tolist() == list(range(1, n + 1)) and log.series["reward"][-1] == pytest.approx(0.59)
    assert log.has("train_acc") and log.series["kl"][1] == pytest.approx(0.001)
    assert noted(log, "no step column: rows are numbered in order") and "dev_chrf (not one value a row)" in log.ignored


def test_the_evaluation_size_is_inferred_from_its_accuracies(tmp_path):
    """Every held-out accuracy is k/16: n = 16, and the decline test uses its binomial noise. Values that
    are rounded (k/3 to 4 decimals) fit no n, and n stays unknown."""
    n = 60
    k = np.tile([3, 5, 6, 8, 9, 11], n // 6)
    csv_log(tmp_path / "a.csv", {"step": np.arange(1, n + 1.0), "reward": np.full(n, 0.5), "eval_acc": k / 16})
    log = load(tmp_path / "a.csv")
    assert log.eval_n == 16 and noted(log, "eval_n = 16, inferred from sample_acc")
    csv_log(tmp_path / "b.csv", {"step": np.arange(1, n + 1.0), "reward": np.full(n, 0.5),
                                 "eval_acc": np.round(np.tile([1, 2, 4, 5, 7, 8], n // 6) / 9, 4)})
    assert load(tmp_path / "b.csv").eval_n is None


def notebook(rows: list[list[str]], header: list[str]) -> dict:
    """An .ipynb whose one output is transformers' NotebookProgressCallback table (the HTML it draws)."""
    th = "".join(f"<th>{h}</th>" for h in header)
    trs = "".join("<tr>" + "".join(f"<td>{v}</td>" for v in r) + "</tr>" for r in rows)
    html = (f"<div><progress value='{len(rows)}' max='{len(rows)}'></progress> [{len(rows)}/{len(rows)}]</div>"
            f'<table border="1" class="dataframe"><thead><tr style="text-align: left;">{th}</tr></thead><tbody>{trs}'
            "</tbody></table>")
    return {"cells": [{"cell_type": "markdown", "source": ["# GRPO"]},
                      {"cell_type": "code", "source": ["trainer.train()"],
                       "outputs": [{"output_type": "display_data",
                                    "data": {"text/html": [html], "text/plain": ["<x>"]}}]}],
            "nbformat": 4}


def test_a_notebooks_saved_progress_table(tmp_path):
    """Unsloth's GRPO notebooks ship with their own run: the Trainer's HTML table, 'rewards / fn' spelled
    with spaces, 'Training Loss' for the loss, 'No log' where a step logged nothing."""
    header = ["Step", "Training Loss", "reward", "reward_std", "kl", "rewards / correctness_reward_func",
              "rewards / xmlcount_reward_func"]
    rows = [[str(s), "No log" if s == 1 else "0.001", f"{0.5 + 0.01 * s:.6f}", "0.3", "0.02", f"{s % 3:.6f}", "0.1"]
            for s in range(1, 41)]
    (tmp_path / "GRPO.ipynb").write_text(json.dumps(notebook(rows, header)))
    log = load(tmp_path / "GRPO.ipynb")
    assert log.format == "notebook" and log.series["step"].tolist() == list(range(1, 41))
    assert np.isnan(log.series["loss"][0]) and log.series["loss"][1] == pytest.approx(0.001)
    assert noted(log, "Training Loss -> loss") and noted(log, "rewards/correctness_reward_func (correctness)")
    assert log.series["train_acc"][:3] == pytest.approx([0.5, 1.0, 0.0])  # a payout of 2: 1.0 is half the answers right
    (tmp_path / "empty.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "source": [], "outputs": []}]}))
    with pytest.raises(IngestError, match="no progress table with a Step column"):
        load(tmp_path / "empty.ipynb")


def test_a_console_log_with_an_sft_stage_then_grpo_is_diagnosed_on_the_grpo_run(tmp_path):
    """TRL's summary dict ends a training: the next one's dicts are numbered from 1 again, and the last run
    is diagnosed. A script's '[Step 3/5] ...' banner and a printed chat message are not steps."""
    sft = [f"{{'loss': {2.0 / s:.3f}, 'grad_norm': 1.0, 'learning_rate': 0.0002, 'epoch': {s / 10}}}"
           for s in range(1, 11)]
    grpo = [f"{{'loss': 0.0, 'reward': {0.25 + 0.01 * s}, 'kl': 0.01, 'frac_reward_zero_std': 0.5, 'epoch': {s / 40}}}"
            for s in range(1, 41)]
    lines = (["[Step 3/5] SFT", *sft, "{'train_runtime': 28.8, 'train_loss': 0.11, 'epoch': 2.0}", "[Step 4/5] GRPO",
              "{'role': 'user', 'content': 'extend the green phase?'}", *grpo])
    (tmp_path / "run.log").write_text("\n".join(lines) + "\n")
    log = load(tmp_path / "run.log")
    assert log.series["step"].tolist() == list(range(1, 41)) and log.series["reward"][0] == pytest.approx(0.26)
    assert noted(log, "the log holds 2 runs") and not noted(log, "role")


def test_trl_loss_that_is_beta_times_kl_is_not_a_measurement(tmp_path):
    """TRL's GRPO loss with one update per batch is beta x KL (the policy term's value is 0); rounded to 4
    decimals as transformers logs it, KL's growth from 0 to 0.2 reads as a loss going from 0 to 0.008."""
    n = 120
    kl = np.linspace(0.0, 0.2, n)
    history = [{"step": s, "loss": round(0.04 * k, 4), "kl": k, "reward": 0.5} for s, k in enumerate(kl, start=1)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    log = load(tmp_path / "trainer_state.json")
    assert "loss" not in log.series and log.has("kl") and noted(log, "loss = 0.04 x kl on every row")
    assert "loss_blowup" in diagnose(log).not_assessable
    rng = np.random.default_rng(5)  # a loss of its own (a second update per batch, or a token-level mean) is kept
    for h in history:
        h["loss"] = round(h["loss"] + 0.002 * float(rng.standard_normal()), 4)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    assert load(tmp_path / "trainer_state.json").has("loss")


def test_a_format_reward_named_exactly_is_not_correctness():
    """Unsloth's match_format_exactly pays for the exact form, not the answer; check_answer is the correctness."""
    from grpo_sentinel.telemetry.health.runlog import component_kind

    assert component_kind("match_format_exactly") == "auxiliary" and component_kind("check_answer") == "correctness"
    assert component_kind("strict_format_reward_func") == "auxiliary" and component_kind("exact_match") == "correctness"


def test_nothing_judged_says_could_not_judge(tmp_path):
    from grpo_sentinel.telemetry.health.report import to_text
    from grpo_sentinel.telemetry.health.thresholds import Thresholds

    n = 60
    csv_log(tmp_path / "a.csv", {"step": np.arange(1, n + 1.0), "loss": np.full(n, 0.1)})  # no reward
    log = load(tmp_path / "a.csv")
    text = to_text(diagnose(log), log, Thresholds())
    assert "could not judge: no reward was read" in text and "no condition found" not in text
    csv_log(tmp_path / "b.csv", {"step": np.arange(1, 31.0), "reward": np.full(30, 0.5)})  # 30 rows < 2 x 20
    log = load(tmp_path / "b.csv")
    assert "could not judge: 30 rows, fewer than two 20-step windows" in to_text(diagnose(log), log, Thresholds())


def test_the_real_corpus_agrees_with_its_authors():
    """benchmarks/wild/. The fit set (the logs the detectors were designed and checked on): no log refused, no
    critical page on a run its authors call healthy, every failure they document paged with a cause that reads
    it. The issue-41 report set (SOURCE `declared`, committed before any detector read it, measured once:
    docs/explanation/lead-time.md): at least the agreement it was reported with, 9 of its 13 scored logs, and no
    refusal but the one it reported (a notebook whose training output is free text). Floors: they may only rise."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from bench_wild import evaluate

    results = evaluate()
    fit = [r for r in results if not r.declared]
    report = [r for r in results if r.declared and not r.absent]
    present = [r for r in fit if not r.absent]  # fetched logs live in shared/wild/; the fixtures are here
    assert len(fit) >= 27 and len(present) >= 2 and not [r.name for r in fit if r.refused]
    assert not [r.stale for r in results if r.stale]  # a file under a log's name that is not SOURCE's version
    assert not [r.name for r in fit if r.expect == "healthy" and r.critical]
    assert not [r.name for r in fit if r.expect == "failure" and r.agrees is False]  # None: absent
    # 17 of 27 logs agree with their authors when all are fetched (the rest: no statement, mixed, or too short)
    assert sum(bool(r.agrees) for r in fit) >= (17 if len(present) == len(fit) else 1)
    if len(report) == len([r for r in results if r.declared]):  # the whole report set is here
        assert sum(bool(r.agrees) for r in report) >= 9
        assert {r.name for r in report if r.refused} <= {"thelmbook-grpo-scratch-qwen15b"}


def test_the_benchmarks_diagnose_with_thresholds_a_run_may_set():
    """`bench_wild.py --set` / `bench_lead_time.py --set`: the same named, checked thresholds a run's
    health.thresholds sets, so the trade a team makes with its config is measured as the defaults are."""
    import sys
    from pathlib import Path

    from grpo_sentinel.telemetry.health.thresholds import parse_settings

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from bench_wild import CORPUS, run_one

    assert parse_settings(["forecast_windows=5", "kl_bound=0.5"]) == {"forecast_windows": 5, "kl_bound": 0.5}
    for text, message in (("forecast_windows", "write NAME=VALUE"), ("forecast_window=5", "did you mean 'forecast_windows'"),
                          ("forecast_windows=2.5", "not a whole number"), ("window=5", "each log's own")):
        with pytest.raises(ValueError, match=message):
            parse_settings([text])
    # The ch06 fixture's loss grows 10x and more over its early median: loss_blowup's critical. Asking for 10^6 x
    # (a multiple: any number > 1) takes that critical, and only it, away.
    default, changed = (run_one(CORPUS / "book-ch06-no-kl-1024", changed=c) for c in (None, {"loss_blowup_factor": 1e6}))
    assert "loss_blowup" in default.critical and "loss_blowup" not in changed.critical
    assert set(default.critical) - {"loss_blowup"} == set(changed.critical) and default.warning == changed.warning


# --- the logs of 2026: names by meaning, several record kinds a step, W&B exports -----------------------------

def test_tinker_cookbook_metrics_are_read_by_meaning(tmp_path):
    """The Tinker cookbook's metrics.jsonl: env/all/... and optim/... names, progress/* bookkeeping, a held-out
    test/env/all/correct every 5 steps, and the sampler-vs-trainer KL (the train/inference mismatch, not KL to
    the reference)."""
    rng = np.random.default_rng(0)
    lines = []
    for s in range(60):
        row = {"step": s, "progress/batch": s, "progress/done_frac": s / 60, "env/all/reward/total": 0.3 + 0.005 * s,
               "env/all/correct": 0.3 + 0.005 * s, "env/all/format": 1.0, "env/all/ac_tokens_per_turn": 120.0 + s,
               "optim/entropy": 0.5 + 0.01 * rng.standard_normal(), "optim/kl_sample_train_v1": 1e-4,
               "optim/kl_sample_train_v2": 2e-4, "optim/lr": 4e-5, "time/total": 12.0}
        if s % 5 == 0:
            row["test/env/all/correct"] = 0.3 + 0.004 * s
        lines.append(json.dumps(row))
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    log = load(tmp_path / "metrics.jsonl")
    read = {r.split(" -> ")[-1]: r.split(" -> ")[0] for r in log.read}
    assert read["reward"] == "env/all/reward/total" and read["train_acc"] == "env/all/correct"
    assert read["entropy"] == "optim/entropy" and read["response_len"] == "env/all/ac_tokens_per_turn"
    assert read["mismatch_kl"] == "optim/kl_sample_train_v2" and "kl" not in read
    assert read["sample_acc"] == "test/env/all/correct" and log.series["sample_acc"][5] == pytest.approx(0.32)
    assert noted(log, "progress/done_frac (no row reads it)")


def test_several_record_kinds_a_step_are_one_row_and_an_evaluation_is_never_a_resume(tmp_path):
    """A course-style loop: rollout, train and (every 5 steps) eval records per GRPO step, keyed by grpo_step
    and optimizer_step. One row a step; the eval record's accuracy is the held-out accuracy of its step; the
    answer accuracy, not the format accuracy, is the correctness."""
    lines = []
    for s in range(1, 31):
        lines.append({"type": "rollout", "grpo_step": s, "reward": 0.2 + 0.01 * s, "answer_accuracy": 0.2 + 0.01 * s,
                      "format_accuracy": 0.9, "avg_response_token_length": 300.0})
        lines.append({"type": "train", "grpo_step": s, "optimizer_step": s, "loss": 0.01, "grad_norm": 0.3,
                      "token_entropy": 0.8, "approx_kl": 1e-3})
        if s % 5 == 0:
            lines.append({"type": "eval", "grpo_step": s, "reward": 0.25, "format_accuracy": 0.95, "answer_accuracy": 0.25})
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + "\n")
    log = load(tmp_path / "metrics.jsonl")
    assert list(log.series["step"]) == list(range(1, 31))  # every training step once: no "resume" dropped any
    read = {r.split(" -> ")[-1]: r.split(" -> ")[0] for r in log.read}
    assert read["step"] == "grpo_step" and read["train_acc"] == "answer_accuracy" and read["entropy"] == "token_entropy"
    assert read["sample_acc"] == "eval/answer_accuracy" and log.series["sample_acc"][4] == 0.25
    assert np.isnan(log.series["sample_acc"][3]) and noted(log, "merged by step into 30 rows")
    assert not any("resumed" in n for n in log.notes)


def test_evaluation_rows_at_a_training_step_join_it_and_a_real_resume_still_reads_as_one(tmp_path):
    rows = [{"step": s, "loss": 0.01, "reward": 0.5} for s in range(1, 21)]
    for s in (10, 20):  # evaluations logged as rows of their own, at the step they evaluate
        rows.insert(next(i for i, r in enumerate(rows) if r["step"] == s) + 1, {"step": s, "eval/pass_at_1": 0.4})
    rows += [{"step": s, "loss": 0.02, "reward": 0.6} for s in range(15, 25)]  # resumed from step 15's checkpoint
    (tmp_path / "log.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    log = load(tmp_path / "log.jsonl")
    assert list(log.series["step"]) == list(range(1, 25)) and log.series["sample_acc"][9] == 0.4
    assert log.series["reward"][14] == 0.6 and any("resumed at step 15" in n for n in log.notes)


def test_a_wandb_history_export(tmp_path):
    """prime-rl's runs as W&B exports them: _step, _runtime, _timestamp, the orchestrator's and the trainer's
    names, the mismatch columns."""
    cols = {"_step": np.arange(0, 80.0), "_runtime": np.arange(80.0) * 30, "_timestamp": 1.7e9 + np.arange(80.0),
            "reward/mean": np.linspace(0.2, 0.5, 80), "entropy/mean": np.full(80, 0.6), "loss/mean": np.full(80, 1e-3),
            "optim/grad_norm": np.full(80, 0.2), "mismatch_kl/mean": np.full(80, 1e-3), "mismatch_kl/max": np.full(80, 0.1),
            "is_masked/mean": np.full(80, 0.01), "seq_len/mean": np.full(80, 400.0)}
    csv_log(tmp_path / "history.csv", cols)
    log = load(tmp_path / "history.csv")
    read = {r.split(" -> ")[-1]: r.split(" -> ")[0] for r in log.read}
    assert read == {"step": "_step", "reward": "reward/mean", "entropy": "entropy/mean", "loss": "loss/mean",
                    "grad_norm": "optim/grad_norm", "mismatch_kl": "mismatch_kl/mean", "is_masked_frac": "is_masked/mean",
                    "response_len": "seq_len/mean"}
    assert noted(log, "_runtime (W&B's seconds since the run started)") and noted(log, "mismatch_kl/max (no row reads it)")


def test_a_reward_component_that_never_pays_is_not_the_correctness(tmp_path):
    cols = {"step": np.arange(1, 41.0), "reward": np.linspace(0.2, 0.6, 40), "rewards/correctness_reward/mean": np.zeros(40),
            "rewards/accuracy_reward/mean": np.linspace(0.2, 0.6, 40)}
    csv_log(tmp_path / "m.csv", cols)
    log = load(tmp_path / "m.csv")
    assert noted(log, "reward_correctness_reward is 0 on every row while the reward is not: not read as the correctness")
    assert log.series["train_acc"][-1] == pytest.approx(0.6)


def test_a_trl_log_whose_sampler_stops_agreeing_pages_the_mismatch_and_one_that_agrees_does_not(tmp_path):
    """TRL 1.16 with vLLM logs the mean |log-prob gap| (sampling/sampling_logp_difference/mean) and the importance
    ratio after its masking; diagnose bounds the mismatch KL from the gap (d^2 / 2). Agreeing: a gap ~0.01 (a bf16
    sampler), steady. Out of sync from step 60 (a weight sync that stopped): the gap jumps to ~0.3 and grows."""
    rng = np.random.default_rng(0)

    def state(gap):
        history = [{"step": s, "loss": 0.01, "reward": 0.5, "rewards/accuracy_reward/mean": 0.5, "learning_rate": 1e-6,
                    "sampling/sampling_logp_difference/mean": float(g), "sampling/sampling_logp_difference/max": float(3 * g),
                    "sampling/importance_sampling_ratio/min": 0.0, "sampling/importance_sampling_ratio/mean": 0.99,
                    "sampling/importance_sampling_ratio/max": 2.9} for s, g in enumerate(gap, start=1)]
        return json.dumps({"log_history": history})

    agree = 0.01 * np.exp(0.1 * rng.standard_normal(120))
    desync = agree.copy()
    desync[59:] = np.linspace(0.3, 0.6, 61)
    for name, gap in (("agree", agree), ("desync", desync)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trainer_state.json").write_text(state(gap))
    assert not [c for c in diagnose(load(tmp_path / "agree")).conditions if c.id == "train_inference_mismatch"]
    paged = [c for c in diagnose(load(tmp_path / "desync")).conditions if c.id == "train_inference_mismatch"]
    assert paged and paged[0].severity == "critical" and paged[0].first_step == 60, paged
    assert "after TRL's truncation or masking" in paged[0].evidence and "from the mean |log-prob gap|" in paged[0].evidence
