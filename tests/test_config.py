"""Bad configs fail before any model loads, with a message that names the field and the fix."""

import time

import pytest

from grpo_sentinel.service.config import ConfigError, SetupError, load_config
from grpo_sentinel.service.launch import check_launch

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)


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
    assert "grpo.temperature" in msg and "greater than or equal to 0.01" in msg


def test_set_overrides_are_typed_and_checked(tmp_path):
    cfg = load_config(None, ["grpo.beta=0.5", "run.steps=7"])
    assert cfg.grpo.beta == 0.5 and cfg.run.steps == 7
    with pytest.raises(ConfigError, match="grpo.bta: unknown key .did you mean 'beta'"):
        load_config(None, ["grpo.bta=0.5"])
    assert load_config(None, ["data.prompt_template={prompt}="]).data.prompt_template == "{prompt}="  # not YAML: text
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(None, ["grpo.beta"])


def launch_problems(tmp_path, text: str) -> str:
    """Validation is pure; what needs the machine (paths, reward imports) is the launch check."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    cfg = load_config(path)  # valid as a config
    with pytest.raises(SetupError) as e:
        check_launch(cfg)
    return str(e.value)


def test_missing_model_dir_and_dataset(tmp_path):
    msg = launch_problems(tmp_path, f"model: {{path: {tmp_path}/nope}}\ndata: {{path: {tmp_path}/nope.jsonl}}\n")
    assert f"model.path: model directory '{tmp_path}/nope' does not exist" in msg
    assert f"data.path: dataset file '{tmp_path}/nope.jsonl' does not exist" in msg


def test_model_dir_without_config_json(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    assert "has no config.json" in launch_problems(
        tmp_path, f"model: {{path: {tmp_path}/m}}\ndata: {{path: {tmp_path}/d.jsonl}}\n"
    )


def test_unknown_reward_function(tmp_path):
    msg = errors_of(tmp_path, "rewards: [{name: corect}]\n")
    assert "unknown reward 'corect' (did you mean 'correct'?)" in msg
    assert "is not 'package.module:function'" in errors_of(tmp_path, "rewards: [{name: 'a b:f'}]\n")
    assert "rewards.0.name: cannot import reward function 'no_such_mod:f'" in \
        launch_problems(tmp_path, "rewards: [{name: 'no_such_mod:f'}]\n")


def test_validation_imports_no_reward_module(tmp_path, monkeypatch):
    """Reading a config never runs the code it names (the daemon validates submissions this way)."""
    (tmp_path / "loud.py").write_text("open(__file__ + '.imported', 'w').close()\ndef f(c, a, p): return 0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(None, ["rewards=[{name: 'loud:f'}]"])
    assert cfg.rewards[0].name == "loud:f" and not (tmp_path / "loud.py.imported").exists()
    check_launch(cfg)  # the process that trains imports it
    assert (tmp_path / "loud.py.imported").exists()


def test_bounds_that_would_end_in_a_traceback(tmp_path):
    msg = errors_of(tmp_path, "run: {seed: 9223372036854775808, eval_seed: -1}\noptim: {betas: [0.9, 1.0], lr: .inf}\n"
                              "grpo: {temperature: 1.0e-300}\nmodel: {lora: {target_modules: []}}\n"
                              "rewards: [{name: correct, weight: .nan}]\n")
    for field in ("run.seed", "run.eval_seed", "optim.betas", "optim.lr", "grpo.temperature",
                  "model.lora.target_modules", "rewards.0.weight"):
        assert f"  - {field}:" in msg, (field, msg)


def test_world_size_advice_is_quick_for_a_huge_batch():
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=r"divides it \(1, 2, 4, 5, 8, 10"):
        load_config(None, ["grpo.prompts_per_step=1000000000", "distributed.nproc_per_node=7"])
    assert time.monotonic() - t0 < 1.0  # O(sqrt n); the linear scan took 23 s here


def test_demo_example_spells_out_the_defaults():
    from helpers import REPO

    assert load_config(REPO / "examples" / "demo.yaml") == load_config()


def test_gpu_example_is_valid_except_for_paths_that_live_on_the_node():
    from helpers import REPO

    cfg = load_config(REPO / "examples" / "gpu-qwen-0.5b.yaml")
    with pytest.raises(SetupError) as e:
        check_launch(cfg)
    problems = [line.split(":")[0].strip("- ") for line in str(e.value).splitlines()[1:]]
    assert problems == ["model.path", "data.path", "data.eval_path"]


def test_health_actions_name_table_conditions():
    with pytest.raises(ConfigError, match="health.stop_on: unknown condition 'reward_saturate' .did you mean 'reward_saturated'"):
        load_config(None, ["health.stop_on=[reward_saturate]"])


def test_health_thresholds_are_named_and_inside_their_domain():
    """health.thresholds changes the detectors' thresholds by name, each checked against its domain when the config
    loads (before any model): a misspelt name gets the nearest one, a count must be whole, a fraction <= 1."""
    assert load_config(None, ["health.thresholds={forecast_windows: 5}"]).health.thresholds == {"forecast_windows": 5}
    for override, message in (
            ("{forecast_window: 5}", "health.thresholds: unknown threshold 'forecast_window' .did you mean 'forecast_windows'"),
            ("{forecast_windows: 2.5}", "health.thresholds: forecast_windows=2.5 is not a whole number"),
            ("{truncation: 2}", "health.thresholds: truncation=2.0: truncation is a fraction of its scale"),
            ("{window: 5}", "health.thresholds: the detector window is health.window")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [f"health.thresholds={override}"])
