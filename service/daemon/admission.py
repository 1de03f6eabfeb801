"""What the daemon admits beyond a valid config: the operator's rules for submitted runs.

A submitted config is validated purely (types and values, `service/config.py`); then these checks,
also pure, decide whether this daemon runs it:

- rewards: the built-ins, or functions in modules the operator listed (`--reward-module`). A
  submitter names code; the daemon never imports it, and only code the operator trusts runs.
- paths: the model and data paths, made absolute, must lie under a root the operator allowed
  (`--allow-path`; the chart's volumes). Nothing is probed: whether the files exist is the run's
  own launch check, so an answer never tells a client what exists elsewhere on the node.
- limits: upper bounds on what makes a run big (group size, prompts per step, completion length,
  LoRA rank, ranks, reward threads, held-out size), so that one request cannot ask for memory
  until the kernel kills something. The operator raises them in the daemon config.

Each refusal is a pydantic-style error (loc, msg, type), answered as a 422 like any other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import Field

from grpo_sentinel.service.config import BUILTIN_REWARDS, DEMO, Config
from grpo_sentinel.telemetry.settings import Section


class Limits(Section):
    group_size: int = Field(256, ge=2, description="Largest grpo.group_size.")
    prompts_per_step: int = Field(1024, ge=1, description="Largest grpo.prompts_per_step.")
    max_new_tokens: int = Field(16384, ge=1, description="Largest grpo.max_new_tokens.")
    lora_r: int = Field(512, ge=1, description="Largest model.lora.r.")
    nproc_per_node: int = Field(16, ge=1, description="Largest distributed.nproc_per_node (ranks of one run).")
    reward_workers: int = Field(64, ge=1, description="Largest grpo.reward_workers.")
    eval_size: int = Field(100_000, ge=1, description="Largest data.eval_size.")
    body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body, in bytes.")

    def bounded(self) -> dict[tuple, tuple[str, int]]:
        """Config field path -> (limit name, limit)."""
        return {("grpo", "group_size"): ("group_size", self.group_size),
                ("grpo", "prompts_per_step"): ("prompts_per_step", self.prompts_per_step),
                ("grpo", "max_new_tokens"): ("max_new_tokens", self.max_new_tokens),
                ("model", "lora", "r"): ("lora_r", self.lora_r),
                ("distributed", "nproc_per_node"): ("nproc_per_node", self.nproc_per_node),
                ("grpo", "reward_workers"): ("reward_workers", self.reward_workers),
                ("data", "eval_size"): ("eval_size", self.eval_size)}


@dataclass(frozen=True)
class Admission:
    reward_modules: tuple[str, ...] = ()
    roots: tuple[Path, ...] = ()  # resolved; paths outside all of them are refused
    limits: Limits = field(default_factory=Limits)

    def admit(self, cfg: Config) -> tuple[Config, list[dict]]:
        """(cfg with its paths made absolute, the errors that refuse it: empty when admitted)."""
        cfg = with_absolute_paths(cfg)
        errors = [*self._limit_errors(cfg), *self._reward_errors(cfg)]
        for loc, value in _paths(cfg):
            if not any(Path(value).is_relative_to(root) for root in self.roots):
                errors.append(_error(loc, f"{value!r} is outside the paths this daemon may read "
                                          f"({', '.join(map(str, self.roots)) or 'none'}); the operator allows "
                                          "more with `serve --allow-path DIR`", "path_not_allowed"))
        return cfg, errors

    def _limit_errors(self, cfg: Config) -> list[dict]:
        errors = []
        for loc, (name, limit) in self.limits.bounded().items():
            value = cfg
            for part in loc:
                value = getattr(value, part)
            if isinstance(value, int) and value > limit:
                errors.append(_error(loc, f"at most {limit} on this daemon (got {value}); the operator sets "
                                          f"limits.{name} in the daemon config", "limit_exceeded"))
        return errors

    def _reward_errors(self, cfg: Config) -> list[dict]:
        errors = []
        for i, spec in enumerate(cfg.rewards):
            if spec.name in BUILTIN_REWARDS:
                continue
            module = spec.name.partition(":")[0]
            if not any(module == m or module.startswith(m + ".") for m in self.reward_modules):
                listed = ", ".join(self.reward_modules) or "none"
                errors.append(_error(("rewards", i, "name"), f"{spec.name!r} is not in a module this daemon runs "
                                                             f"(listed: {listed}); use a built-in "
                                                             f"({', '.join(BUILTIN_REWARDS)}) or ask the operator to add "
                                                             "its module with `serve --reward-module MODULE`",
                                     "reward_not_allowed"))
        return errors


def with_absolute_paths(cfg: Config) -> Config:
    """The model and data paths resolved against the daemon's directory, symlinks followed (no way out of
    a root through a link): a run's process works in its own run directory."""
    cfg = cfg.model_copy(deep=True)
    for (section, key), value in _paths(cfg):
        setattr(getattr(cfg, section), key, os.path.realpath(Path(value).expanduser()))
    return cfg


def _paths(cfg: Config) -> list[tuple[tuple[str, str], str]]:
    return [(loc, value) for loc, value in ((("model", "path"), cfg.model.path), (("data", "path"), cfg.data.path),
                                            (("data", "eval_path"), cfg.data.eval_path))
            if value is not None and value != DEMO]


def _error(loc: tuple, msg: str, kind: str) -> dict:
    return {"loc": list(loc), "msg": msg, "type": kind}
