"""The non-demo path a GPU node uses: a local model directory and a JSONL dataset."""

import csv
import json
import subprocess

import pytest

from helpers import cli

pytestmark = pytest.mark.slow  # the second tier (README, Tests)


def test_local_model_dir_and_jsonl_dataset(tmp_path, demo_dir):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a + 1}", "answer": str(2 * a + 1)}) + "\n" for a in range(60)))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"""
model: {{path: {demo_dir}}}
data: {{path: {data}, eval_size: 16, verifier: numeric, prompt_template: "{{prompt}}="}}
rewards: [{{name: correct, weight: 1.0}}, {{name: format, weight: 0.5}}]
grpo: {{group_size: 4, prompts_per_step: 4, loss_type: dapo, mu: 2, micro_batch_size: 5}}
run: {{steps: 4, sample_every: 2, run_id: r}}
""")
    p = subprocess.run(cli("train", "--config", str(cfg), "--out", str(tmp_path), "--set", "telemetry.prometheus=false"),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "r" / "steps.csv").open()))
    assert [r["step"] for r in rows] == ["1", "2", "3", "4"]
    assert [r["eval_n"] for r in rows] == ["", "16", "", "16"]
    for r in rows:  # combined = correct + 0.5 * format, on the step means (each rounded to 6 digits)
        assert abs(float(r["reward"]) - float(r["reward_correct"]) - 0.5 * float(r["reward_format"])) < 1e-5
        assert float(r["train_acc"]) == float(r["reward_correct"])
