"""Bad configs fail before any model loads, with a message that names the field and the fix."""

import json
import subprocess
import time

import pytest

from conftest import cli
from grpo_sentinel.service.config import ConfigError, load_config


def errors_of(tmp_path, text: str = "", overrides=()) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path, list(overrides))
    return str(e.value)


def test_defaults_are_the_demo():
    cfg = load_config()
    assert (cfg.model.path, cfg.data.path, cfg.run.steps, cfg.run.sample_every) == ("demo", "demo", 300, 20)


def test_malformed_yaml(tmp_path):
    msg = errors_of(tmp_path, "grpo: {beta: 0.1\n")
    assert "not valid YAML" in msg and "c.yaml" in msg


def test_top_level_must_be_a_mapping(tmp_path):
    assert "mapping at the top level" in errors_of(tmp_path, "- 1\n- 2\n")


def test_unknown_keys_get_did_you_mean(tmp_path):
    msg = errors_of(tmp_path, "grpo:\n  group_sise: 8\noptim:\n  learning_rate: 0.1\n")
    assert "grpo.group_sise: unknown key (did you mean 'group_size'?)" in msg
    assert "optim.learning_rate: unknown key" in msg
    assert "2 problems" in msg  # every problem at once, not one per attempt


def test_unknown_section(tmp_path):
    assert "grpoo: unknown key (did you mean 'grpo'?)" in errors_of(tmp_path, "grpoo: {}\n")


def test_wrong_types_and_ranges(tmp_path):
    msg = errors_of(tmp_path, "grpo:\n  group_size: many\n  temperature: -1\n")
    assert "grpo.group_size" in msg and "'many'" in msg
    assert "grpo.temperature" in msg and "greater than 0" in msg


def test_set_overrides_are_typed_and_checked(tmp_path):
    cfg = load_config(None, ["grpo.beta=0.5", "run.steps=7"])
    assert cfg.grpo.beta == 0.5 and cfg.run.steps == 7
    with pytest.raises(ConfigError, match="grpo.bta: unknown key .did you mean 'beta'"):
        load_config(None, ["grpo.bta=0.5"])
    assert load_config(None, ["data.prompt_template={prompt}="]).data.prompt_template == "{prompt}="  # not YAML: text
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["grpo.beta"])


def test_missing_model_dir_and_dataset(tmp_path):
    msg = errors_of(tmp_path, f"model: {{path: {tmp_path}/nope}}\ndata: {{path: {tmp_path}/nope.jsonl}}\n")
    assert f"model.path: model directory '{tmp_path}/nope' does not exist" in msg
    assert f"data.path: dataset file '{tmp_path}/nope.jsonl' does not exist" in msg


def test_model_dir_without_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    assert "has no config.json" in errors_of(tmp_path, f"model: {{path: {tmp_path}/m}}\n")


def test_unknown_reward_function(tmp_path):
    msg = errors_of(tmp_path, "rewards: [{name: corect}]\n")
    assert "unknown reward 'corect' (did you mean 'correct'?)" in msg
    assert "cannot import reward function" in errors_of(tmp_path, "rewards: [{name: 'no_such_mod:f'}]\n")


def test_cli_rejects_bad_config_before_loading_any_model(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("grpo:\n  beta: -1\n")
    t0 = time.monotonic()
    p = subprocess.run(cli("train", "--config", str(path), "--out", str(tmp_path)), capture_output=True, text=True)
    assert p.returncode == 2
    assert "grpo.beta: Input should be greater than or equal to 0 (got -1)" in p.stderr
    assert not any(tmp_path.glob("*/config.yaml"))  # no run directory was started
    assert time.monotonic() - t0 < 60  # generous; the point is: no model, no warm-up


def test_cli_rejects_a_dataset_row_without_answer(tmp_path, demo_dir):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n" + json.dumps({"prompt": "2+2="}) + "\n")
    p = subprocess.run(cli("train", "--out", str(tmp_path), "--set", f"model.path={demo_dir}",
                           "--set", f"data.path={data}", "--set", "telemetry.prometheus=false"), capture_output=True, text=True)
    assert p.returncode == 2
    assert f"{data}:2: row has no 'answer' field" in p.stderr


def test_demo_example_spells_out_the_defaults():
    from conftest import REPO

    assert load_config(REPO / "examples" / "demo.yaml") == load_config()


def test_gpu_example_is_valid_except_for_paths_that_live_on_the_node():
    from conftest import REPO

    with pytest.raises(ConfigError) as e:
        load_config(REPO / "examples" / "gpu-qwen-0.5b.yaml")
    problems = [line.split(":")[0].strip("- ") for line in str(e.value).splitlines()[1:]]
    assert problems == ["model.path", "data.path", "data.eval_path"]


def test_health_actions_name_table_conditions():
    with pytest.raises(ConfigError, match="health.stop_on: unknown condition 'reward_saturate' .did you mean 'reward_saturated'"):
        load_config(None, ["health.stop_on=[reward_saturate]"])
