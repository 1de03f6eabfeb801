"""One typed config for a run, validated once before anything heavy loads.

Load order: defaults <- YAML file <- `--set a.b=c` overrides <- CLI flags. Every error is
collected and reported together, each naming the field and, for a misspelt key, the closest
valid one.

Validation is pure: types, values and their combinations, nothing else. It never touches the
filesystem and never imports a reward module, so the daemon can validate a submission and any
reader can load a run's saved config (whose dataset may have moved since) without side effects.
Whether a config can launch here (the model and data exist, the rewards import) is
`service/launch.py`'s question, asked by the process that trains.
"""

from __future__ import annotations

import difflib
import math
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PlainValidator, ValidationError, WithJsonSchema, field_validator, model_validator

from grpo_sentinel.telemetry.settings import HealthSettings, Section, TelemetrySettings, TracesSettings, error_lines

DEMO = "demo"  # model.path / data.path value that selects the embedded tiny model and task
BUILTIN_REWARDS = ("correct", "format")  # service/rewards.py implements them
SEED_LIMIT = 2**63  # seeds feed torch and numpy generators, which take unsigned 64-bit values at most
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")


def _count_or_auto(v: Any) -> int | str:
    if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
        return v
    raise ValueError("must be a whole number (at least 1) or 'auto'")


# A number of processes or threads, or 'auto': one check and one message for either.
CountOrAuto = Annotated[int | Literal["auto"], PlainValidator(_count_or_auto),
                        WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"const": "auto"}]})]


class ConfigError(ValueError):
    """A config that cannot run; the message lists every problem found."""


class SetupError(ValueError):
    """The run cannot start as configured (found before the weights load); the message says what to fix."""


class LoraSettings(Section):
    r: int = Field(8, gt=0, description="LoRA rank.")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA path.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="Module names that get adapters (Llama/Qwen2 naming).",
    )


class ModelSettings(Section):
    path: str = Field(DEMO, description="Local Hugging Face causal-LM directory, or 'demo' for the embedded tiny model.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Weights dtype. Log-probs, KL and entropy are always computed in float32."
    )
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$",
                        description="'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'.")
    lora: LoraSettings = Field(default_factory=LoraSettings)


class DataSettings(Section):
    path: str = Field(DEMO, description="JSONL of {\"prompt\": ..., \"answer\": ...} rows, or 'demo' (two-digit addition).")
    eval_path: str | None = Field(None, description="JSONL held-out set; default: carve `eval_size` rows out of `path`.")
    eval_size: int = Field(200, gt=0, description="Size of the fixed held-out subset that sample_acc is measured on.")
    verifier: Literal["exact", "numeric", "boxed"] = Field(
        "exact",
        description="How a completion is checked: exact string, numeric value, or last \\boxed{} (numeric if both parse).",
    )
    prompt_template: str = Field("{prompt}", description="Python format string applied to each row's prompt.")
    max_prompt_tokens: int | None = Field(None, gt=0, description="Longest prompt (template applied) in tokens; "
                                                                  "default: the model's context minus max_new_tokens.")
    long_prompts: Literal["error", "truncate"] = Field(
        "error", description="A longer prompt is a data error naming its line, or is cut to its last "
                             "max_prompt_tokens tokens (counted in summary.json)."
    )

    @field_validator("prompt_template")
    @classmethod
    def _template_formats(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise ValueError("prompt_template must contain '{prompt}'")
        try:
            v.format(prompt="")
        except (KeyError, IndexError) as e:
            raise ValueError(f"prompt_template may only use {{prompt}}; it also names {e} (write a literal brace as "
                             "{{ or }})") from None
        except ValueError as e:
            raise ValueError(f"prompt_template is not a valid format string ({e}; write a literal brace as {{ or }})") from None
        return v


class RewardSpec(Section):
    name: str = Field(description="Built-in reward ('correct', 'format') or 'package.module:function'.")
    weight: float = Field(1.0, description="Weight in the combined reward (weighted sum).")

    @field_validator("name")
    @classmethod
    def _well_formed(cls, v: str) -> str:
        """A built-in or the shape of 'package.module:function'; whether it imports is a launch check."""
        if v in BUILTIN_REWARDS or _FUNCTION.match(v):
            return v
        if ":" not in v:
            close = difflib.get_close_matches(v, BUILTIN_REWARDS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"unknown reward {v!r}{hint}; built-ins: {sorted(BUILTIN_REWARDS)}, or 'module:function'")
        raise ValueError(f"reward {v!r} is not 'package.module:function' (dotted Python names, one colon)")


class GRPOSettings(Section):
    group_size: int = Field(8, ge=2, description="G: completions sampled per prompt (advantages need >= 2).")
    prompts_per_step: int = Field(8, gt=0, description="Prompts per optimizer step (batch = prompts_per_step * group_size).")
    max_new_tokens: int = Field(6, gt=0, description="Completion length cap; a completion without EOS by then is 'truncated'.")
    temperature: float = Field(1.0, ge=0.01, le=100, description="Sampling temperature; log-probs in the loss use the same "
                                                                 "temperature (below 0.01 the scaled logits overflow).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass.")
    beta: float = Field(0.04, ge=0, description="KL coefficient (k3 to the adapter-disabled base). 0 skips the reference pass.")
    eps_low: float = Field(0.2, ge=0, description="Lower clip of the policy ratio (1 - eps_low).")
    eps_high: float = Field(0.2, ge=0, description="Upper clip of the policy ratio (1 + eps_high); > eps_low is 'clip-higher'.")
    mu: int = Field(1, ge=1, description="Optimizer updates per batch of samples (inner iterations).")
    loss_type: Literal["grpo", "dapo", "dr_grpo"] = Field(
        "grpo", description="grpo: per-sequence token mean; dapo: token-level mean; dr_grpo: sum / (sequences * max_new_tokens)."
    )
    scale_rewards: Literal["group", "none"] = Field(
        "group", description="Divide advantages by the group's unbiased std + 1e-4, or not."
    )
    invalid_reward: Literal["exclude", "fallback"] = Field(
        "exclude",
        description="A reward that raises or is NaN/inf/None: drop the sample from its group, or use `reward_fallback`.",
    )
    reward_fallback: float = Field(0.0, description="Reward used for an invalid sample when invalid_reward = fallback.")
    micro_batch_size: int = Field(64, gt=0, description="Sequences per forward/backward chunk (gradients accumulate).")
    reward_timeout_s: float = Field(60.0, gt=0, description="A call of a reward function (module:function) that takes "
                                                            "longer makes its sample invalid ('timeout').")
    reward_workers: int = Field(1, ge=1, description="Threads calling reward functions (module:function) in parallel; "
                                                     "more helps rewards that wait on I/O.")
    is_correction: Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"] = Field(
        "none", description="Importance-sampling correction of the train/inference mismatch, as TRL 1.16 defines it: "
                            "weigh each token's loss by p_trainer / p_sampler per token or per sequence (the product), "
                            "truncated to [is_clip_min, is_clip_max] or masked to 0 outside it. 'none': no weight.")
    is_clip_max: float | None = Field(3.0, gt=0, description="Upper bound of the importance ratio (TRL's "
                                                              "vllm_importance_sampling_clip_max); null: none.")
    is_clip_min: float | None = Field(None, ge=0, description="Lower bound of the importance ratio; null: none.")

    @model_validator(mode="after")
    def _correction_bounds(self) -> GRPOSettings:
        lo, hi = self.is_clip_min, self.is_clip_max
        if lo is not None and hi is not None and lo >= hi:
            raise ValueError(f"is_clip_min ({lo}) must be below is_clip_max ({hi})")
        if self.is_correction.endswith("truncate") and lo is None and hi is None:
            raise ValueError(f"is_correction={self.is_correction} truncates to bounds: set is_clip_max or is_clip_min")
        return self


class VLLMSettings(Section):
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="Share of the GPU's memory the engine may "
                                                                        "take (weights, KV cache); the trainer needs the rest.")
    enforce_eager: bool = Field(True, description="No CUDA graphs or torch.compile: starts in seconds (on a CPU the "
                                                  "compile takes ~a minute); set false on a GPU for long runs.")
    kv_cache_gib: float = Field(1.0, gt=0, description="On a CPU: GiB of KV cache (VLLM_CPU_KVCACHE_SPACE).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The engine's weights; 'auto': model.dtype, so sampler and trainer agree. Another "
                            "precision is the mismatch row's classic cause (a bf16 sampler for an fp32 trainer).")


class RolloutSettings(Section):
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="hf: our decoder in the training process (the default; the demo's). vllm: vLLM's engine in its "
                          "own process, the base model loaded once and the policy's LoRA adapter handed over after "
                          "every optimizer step (docs/guides/vllm.md).")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings)


class OptimSettings(Section):
    lr: float = Field(1e-3, gt=0, description="AdamW peak learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW's (beta1, beta2), each in [0, 1).")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Decay after warm-up, to 0 at the last step."
    )
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up steps.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError(f"each of AdamW's betas must be in [0, 1), e.g. [0.9, 0.99] (got {list(v)})")
        return v


class RunSettings(Section):
    steps: int = Field(300, gt=0, description="Optimizer steps in the run.")
    seed: int = Field(
        0,
        ge=0,
        lt=SEED_LIMIT,
        description="Seeds data order, sampling and the held-out split; a step's randomness derives from (seed, step).",
    )
    out_dir: str = Field("runs", description="Parent folder of run directories.")
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9._-]{1,100}$",
                               description="Run directory name (letters, digits, . _ -); default: timestamp + seed.")
    sample_every: int = Field(20, gt=0, description="Evaluate sample_acc on the held-out subset every N steps (and at 0).")
    eval_seed: int = Field(
        1234,
        ge=0,
        lt=SEED_LIMIT,
        description="Sampling seed of the held-out evaluation (identical at every sampling point).",
    )
    checkpoint_every: int = Field(50, gt=0, description="Checkpoint every N steps (and at the end and on SIGTERM).")
    keep_checkpoints: int = Field(2, ge=1, description="Newest complete checkpoints kept on disk.")
    max_consecutive_faults: int = Field(
        3, ge=1, description="Halt after this many skipped updates in a row (non-finite, or no sample scored)."
    )
    cpu_threads: CountOrAuto = Field(
        "auto", description="torch's intra-op threads. 'auto': the cores this process may use (its affinity), shared "
                            "with the other training processes on them (service/cpu.py); OMP_NUM_THREADS also sets it.")

    @field_validator("run_id")
    @classmethod
    def _not_a_parent(cls, v: str | None) -> str | None:
        if v in (".", ".."):
            raise ValueError("a run id names a directory: not '.' or '..'")
        return v


class DistributedSettings(Section):
    nproc_per_node: CountOrAuto = Field(
        1, description="Training processes the daemon starts for a run (torch's elastic launcher); 'auto': one per "
                       "visible GPU. Under torchrun, its --nproc_per_node decides.")
    timeout_s: float = Field(600.0, gt=0, description="A collective that waits longer ends the run with an error "
                                                     "(a dead or hung rank), instead of hanging the others.")


def divisors(n: int) -> list[int]:
    """The divisors of n in order, in O(sqrt n) (n may be large: this runs while a request waits)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def check_world_size(prompts_per_step: int, world: int) -> None:
    """Each rank trains whole prompts (a group is never split), so the world size must divide the global batch."""
    if prompts_per_step % world:
        fits = divisors(prompts_per_step)[:12]
        raise ConfigError(f"grpo.prompts_per_step={prompts_per_step} cannot be split over {world} ranks (each rank "
                          f"takes whole prompts): use a world size that divides it ({', '.join(map(str, fits))}), "
                          "or change grpo.prompts_per_step")


class Config(Section):
    model: ModelSettings = Field(default_factory=ModelSettings)
    data: DataSettings = Field(default_factory=DataSettings)
    rewards: list[RewardSpec] = Field(default_factory=lambda: [RewardSpec(name="correct", weight=1.0)])
    grpo: GRPOSettings = Field(default_factory=GRPOSettings)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    optim: OptimSettings = Field(default_factory=OptimSettings)
    run: RunSettings = Field(default_factory=RunSettings)
    telemetry: TelemetrySettings = Field(default_factory=TelemetrySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    traces: TracesSettings = Field(default_factory=TracesSettings)
    distributed: DistributedSettings = Field(default_factory=DistributedSettings)

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        if not self.rewards:
            raise ValueError("rewards: at least one reward function is needed")
        if (self.model.path == DEMO) != (self.data.path == DEMO):
            raise ValueError("model.path and data.path: the demo model only speaks the demo task; set both or neither to 'demo'")
        if self.rollout.backend == "vllm" and self.distributed.nproc_per_node != 1:
            raise ValueError("rollout.backend=vllm runs one engine for one training process: use "
                             "distributed.nproc_per_node=1 (one engine per rank is not supported yet)")
        if isinstance(self.distributed.nproc_per_node, int):
            try:
                check_world_size(self.grpo.prompts_per_step, self.distributed.nproc_per_node)
            except ConfigError as e:
                raise ValueError(f"distributed.nproc_per_node: {e}") from None
        return self

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


# ---------------------------------------------------------------------------------------------
# Loading, overrides and error messages


def load_config(path: str | Path | None = None, overrides: list[str] = (), **cli: Any) -> Config:
    """Defaults <- YAML file <- `a.b=c` overrides <- non-None CLI values given as dotted keys."""
    return validate(raw_config(path, overrides, **cli))


def raw_config(path: str | Path | None = None, overrides: list[str] = (), **cli: Any) -> dict[str, Any]:
    """The mapping load_config validates: the YAML file with the overrides and CLI values set into it.
    `runs submit` sends it as is, for the daemon to validate (its paths and reward modules are the daemon's)."""
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except FileNotFoundError:
            raise ConfigError(f"config file {str(path)!r} does not exist") from None
        except IsADirectoryError:
            raise ConfigError(f"config file {str(path)!r} is a directory: give the YAML file") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {str(path)!r} is not UTF-8 text: give a YAML file") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML:\n{e}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level, not {type(raw).__name__}")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set grpo.beta=0.02")
        _set_dotted(raw, key.strip(), _parse_value(value))
    for key, value in cli.items():
        if value is not None:
            _set_dotted(raw, key, value)
    return raw


def validate(raw: dict[str, Any]) -> Config:
    try:
        return Config.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(format_errors(e)) from None


def _parse_value(text: str) -> Any:
    """A --set value is YAML (0.5 -> float, [a, b] -> list); text that is not YAML stays a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a section")
    node[leaf] = value


def format_errors(e: ValidationError) -> str:
    return format_error_list(e.errors())


def format_error_list(errors: list[dict]) -> str:
    """Pydantic's errors as one message: every problem, its field path, and for a misspelt key the nearest one."""
    lines = [f"invalid config ({len(errors)} problem{'s' * (len(errors) > 1)}):"]
    return "\n".join(lines + [f"  - {line}" for line in error_lines(errors, Config)])
