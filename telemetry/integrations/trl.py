"""Our health telemetry on TRL's GRPOTrainer, in two lines: the same run record, `/metrics`, online
health verdicts (with their stop / halt actions), alert rules, dashboard and Langfuse traces as a
native run, for everything TRL exposes.

    from grpo_sentinel.integrations.trl import SentinelCallback
    GRPOTrainer(..., reward_funcs=SentinelCallback.wrap_rewards(reward_funcs),
                callbacks=[SentinelCallback(out_dir="runs")])

The callback reads TRL's logged values at each `on_log` (trl_stats.py maps them). Wrapped reward
functions also record each completion's rewards, so the per-completion histograms, the group
advantages (derived with the trainer's own num_generations and scale_rewards) and the all-correct /
all-wrong split exist too; without them those are absent, never guessed.

The run itself is a RunSession (telemetry/session.py), the one the native trainer holds: the record,
/metrics, the monitor and traces, the summary, events.jsonl and run.json (the scales `diagnose`
reads). What is here is the mapping of TRL's logs onto its rows.

Once per job: TRL calls every callback on every rank, but only the world's process zero keeps the
run (its session). The other ranks send it their share of the per-completion rewards (TRL gathers
its logged means itself; a group can span ranks) and take its health action, so that every rank
stops at the same step.

Telemetry never stops training: a failure in it is logged, counted in summary.json, and TRL trains
on. Input the callback cannot use fails before training: its options and the TRL version at
construction, the trainer's config at on_train_begin.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import math
import os
import re
import sys
import threading
from dataclasses import replace
from importlib import metadata
from pathlib import Path

import torch
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pydantic import BaseModel, ValidationError
from transformers import TrainerCallback

from grpo_sentinel.integrations import trl_stats
from grpo_sentinel.integrations.trl_stats import Generation, Setup
from grpo_sentinel.telemetry import runfiles
from grpo_sentinel.telemetry.health.runlog import CORRECTNESS
from grpo_sentinel.telemetry.otel import OTelSink, otlp_exporter_from_env
from grpo_sentinel.telemetry.schema import RunInfo, StepStats
from grpo_sentinel.telemetry.session import RunSession, run_scales
from grpo_sentinel.telemetry.settings import HealthSettings, TelemetrySettings, TracesSettings, error_lines
from grpo_sentinel.telemetry.traces import trace_sink

log = logging.getLogger(__name__)

SUPPORTED = SpecifierSet(">=1.16,<1.17")  # the TRL versions the tests run (pyproject's `trl` extra)
CURVE_EVERY = 20  # reward-vs-step.csv rows every this many rows when no evaluation gives them
# Catalogue rows TRL cannot feed, and why: they stay absent (tests/test_trl.py checks a real scrape).
NOT_FED = {"grpo.kl": "TRL logs the mean KL only, not each completion's",
           "grpo.entropy": "TRL logs the mean entropy only, not each completion's",
           **{f"grpo.rank.{m}": "TRL's ranks time and measure their steps themselves; it logs none of it per rank"
              for m in ("step_time", "collective_wait", "peak_memory")},
           "grpo.mismatch.logp_diff": "TRL logs the mean and the largest log-prob gap, not each token's",
           "grpo.mismatch.kl": "TRL logs the |log-prob gap|, not a KL estimate (diagnose bounds it from the mean gap)",
           "grpo.importance.masked_fraction": "TRL logs no share of masked tokens"}
# Rows TRL feeds only when it samples with vLLM and corrects for it (use_vllm, its default correction): its
# sampling/* keys.
WITH_VLLM = {"grpo.mismatch.logp_diff.mean", "grpo.mismatch.logp_diff.max", "grpo.importance_ratio"}
_RUN_ID = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


class SentinelSetupError(ValueError):
    """The callback cannot run as set up; the message says what to change."""


# ---------------------------------------------------------------------------------------------
# Wrapped reward functions


class _Recorder:
    """What the wrapped reward functions saw, per generation batch, until the callback takes it at the
    next on_log. One per process, like the reward functions: wrap_rewards runs before any trainer or
    callback exists."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # async reward functions run on TRL's event-loop thread
        self.names: tuple[str, ...] = ()  # the wrapped functions, in order
        self.listening = False  # a callback is inside trainer.train()
        # Between on_step_begin and on_step_end: a training generation. TRL's evaluation scores its
        # completions outside any step; those are not training samples.
        self.in_step = False
        self._open: dict[int, tuple[list, Generation]] = {}  # id(completions) -> (the list, kept alive; its batch)
        self._warned = False

    def start(self) -> None:
        """A training run begins: record from now on, nothing left from an earlier one."""
        with self._lock:
            self.listening, self.in_step, self._open = True, False, {}

    def record(self, name: str, kwargs: dict, values) -> None:
        if not (self.listening and self.in_step):
            return
        try:
            completions = kwargs["completions"]
            scores = [math.nan if v is None else float(v) for v in values]
            with self._lock:
                # Every function of one batch gets the same `completions` list: it names the batch.
                entry = self._open.get(id(completions))
                if entry is None:
                    entry = self._open[id(completions)] = (completions, _generation(kwargs))
                entry[1].rewards[name] = scores
        except Exception as e:  # noqa: BLE001 - a reward we cannot read must not fail the reward call
            if not self._warned:
                log.warning("SentinelCallback: cannot record the rewards of %s (%s); per-completion metrics "
                            "miss these batches", name, e)
                self._warned = True

    def take(self) -> list[Generation]:
        """The batches every wrapped function has scored, in the order they were generated."""
        with self._lock:
            done = [k for k, (_, g) in self._open.items() if len(g.rewards) == len(self.names)]
            return [self._open.pop(k)[1] for k in done]


_RECORDER = _Recorder()


def _text(x) -> str:
    """A prompt or completion as text: TRL passes strings, or chat messages ([{role, content}, ...])."""
    if isinstance(x, str):
        return x
    if isinstance(x, list) and all(isinstance(m, dict) for m in x):
        return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in x)
    return str(x)


def _generation(kwargs: dict) -> Generation:
    ids = kwargs.get("completion_ids")
    if ids is None:
        raise ValueError("TRL passed no completion_ids")
    answers = kwargs.get("answer", kwargs.get("solution"))  # the data set's answer column, by its common names
    n = len(kwargs["completions"])
    return Generation(prompts=[_text(p) for p in kwargs["prompts"]], completions=[_text(c) for c in kwargs["completions"]],
                      answers=[str(a) for a in answers] if isinstance(answers, list) else [""] * n,
                      lengths=[len(i) for i in ids], last_tokens=[int(i[-1]) if len(i) else -1 for i in ids])


def _unwrap(func):
    while isinstance(func, functools.partial):
        func = func.func
    return func


def _name(func) -> str:
    """The name TRL logs a reward function under (trl.trainer.utils.get_callable_name)."""
    func = _unwrap(func)
    return getattr(func, "__name__", type(func).__name__)


def _wrap(func, name: str):
    inner = _unwrap(func)
    if inspect.iscoroutinefunction(inner) or inspect.iscoroutinefunction(getattr(inner, "__call__", None)):
        async def wrapped(*args, **kwargs):
            values = await func(*args, **kwargs)
            _RECORDER.record(name, kwargs, values)
            return values
    else:
        def wrapped(*args, **kwargs):
            values = func(*args, **kwargs)
            _RECORDER.record(name, kwargs, values)
            return values
    functools.update_wrapper(wrapped, inner)
    wrapped.__name__ = wrapped.__qualname__ = name  # TRL names the logged rewards/<fn>/mean after it
    wrapped.sentinel_wrapped = True
    return wrapped


# ---------------------------------------------------------------------------------------------
# Checks before training


def _supported_trl() -> str:
    try:
        version = metadata.version("trl")
    except metadata.PackageNotFoundError:
        raise SentinelSetupError("TRL is not installed: pip install 'grpo-sentinel[trl]'") from None
    if Version(version) not in SUPPORTED:
        raise SentinelSetupError(f"SentinelCallback reads TRL {SUPPORTED} (what its tests run); this environment has "
                                 f"trl {version}: pip install 'grpo-sentinel[trl]'")
    return version


def _section(model: type[BaseModel], value, name: str):
    if value is None:
        return model()
    if isinstance(value, model):
        return value
    try:
        return model.model_validate(value)
    except ValidationError as e:
        raise SentinelSetupError(f"SentinelCallback({name}=...): " + "; ".join(error_lines(e.errors(), model))) from None


def _value(option) -> str:
    """A transformers strategy option (an enum, or its string) as its string."""
    return str(getattr(option, "value", option))


def _config_problems(args) -> list[str]:
    """Why the callback cannot read this trainer's config (empty: it can)."""
    needed = ("num_generations", "scale_rewards", "multi_objective_aggregation", "loss_type", "max_completion_length",
              "num_iterations", "reward_weights")
    missing = [a for a in needed if not hasattr(args, a)]
    if missing:
        return [f"the trainer's args are a {type(args).__name__}, not TRL's GRPOConfig (no {', '.join(missing)}): "
                "SentinelCallback reads a GRPOTrainer"]
    problems = []
    if args.scale_rewards not in trl_stats.SCALINGS:
        problems.append(f"scale_rewards={args.scale_rewards!r}: the callback derives advantages for "
                        f"{', '.join(trl_stats.SCALINGS)}")
    if args.multi_objective_aggregation not in trl_stats.AGGREGATIONS:
        problems.append(f"multi_objective_aggregation={args.multi_objective_aggregation!r}: the callback derives "
                        f"advantages for {', '.join(trl_stats.AGGREGATIONS)}")
    if _value(args.logging_strategy) == "no":
        problems.append("logging_strategy='no': TRL then logs nothing for the callback to read; set logging_steps")
    return problems


def _launch_rank() -> int:
    """This process's rank as the launcher set it (torchrun, accelerate launch and deepspeed set RANK),
    before any process group exists: the one that binds /metrics at construction."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


# ---------------------------------------------------------------------------------------------
# Across ranks


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _gather(gens: list[Generation]) -> list[Generation]:
    """Every rank's share of the batches since the last log, merged on process zero (TRL calls the
    reward functions with each rank's own completions). A collective: every rank calls it at each on_log."""
    if _world() == 1:
        return gens
    import torch.distributed as dist

    zero = dist.get_rank() == 0
    parts = [None] * _world() if zero else None
    dist.gather_object(gens, parts, dst=0)
    if not zero:
        return []
    if len({len(p) for p in parts}) != 1:
        log.warning("SentinelCallback: the ranks recorded %s batches since the last log; per-completion metrics "
                    "skip this row", [len(p) for p in parts])
        return []
    return [trl_stats.merge(list(batch)) for batch in zip(*parts)]


def _broadcast(action: str) -> str:
    """Process zero's health action, to every rank: they all stop at the same step."""
    if _world() == 1:
        return action
    import torch.distributed as dist

    box = [action]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ---------------------------------------------------------------------------------------------
# The callback


class SentinelCallback(TrainerCallback):
    """A transformers TrainerCallback for TRL's GRPOTrainer (see the module docstring).

    out_dir, run_id: the run directory is `out_dir/run_id` (default id: trl-<time>-seed<seed>).
    telemetry, health, traces: the same settings as a native run's config sections (objects or dicts).
    correctness: the reward function that judges the answer (1 right, 0 wrong); default: the first
        whose name says so (accuracy_reward, correct, ...), as `grpo-sentinel diagnose` reads one.
    max_reward: the largest combined reward (default: the sum of the positive reward weights, at least 1).
    """

    def __init__(self, out_dir: str | Path = "runs", run_id: str | None = None, *, telemetry=None, health=None,
                 traces=None, correctness: str | None = None, max_reward: float | None = None):
        self.trl_version = _supported_trl()
        self.telemetry = _section(TelemetrySettings, telemetry, "telemetry")
        self.health = _section(HealthSettings, health, "health")
        self.traces = _section(TracesSettings, traces, "traces")
        if run_id is not None and not _RUN_ID.match(run_id):
            raise SentinelSetupError(f"run_id={run_id!r}: use letters, digits, '.', '_' and '-' (at most 100)")
        if max_reward is not None and not (isinstance(max_reward, (int, float)) and math.isfinite(max_reward)
                                           and max_reward > 0):
            raise SentinelSetupError(f"max_reward={max_reward!r}: give the largest combined reward, a number > 0")
        self.out_dir, self.run_id, self.correctness, self.max_reward = Path(out_dir), run_id, correctness, max_reward
        self._otel: OTelSink | None = None
        self._run: _Run | None = None
        self.run_dir: Path | None = None  # this process's run directory, once training began (process zero)
        self._prepared = False  # the run directory checked and /metrics bound
        if _launch_rank() == 0:  # the process that will keep the run: fail now on what it cannot use
            self._prepare()

    def _prepare(self) -> None:
        self._check_out_dir()
        self._otel = self._metrics()
        self._prepared = True

    def _check_out_dir(self) -> None:
        if self.run_id and (self.out_dir / self.run_id).exists():
            raise SentinelSetupError(f"run directory {self.out_dir / self.run_id} already exists: pick another run_id")
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise SentinelSetupError(f"out_dir={str(self.out_dir)!r}: cannot create it ({e.strerror})") from None

    def _metrics(self) -> OTelSink | None:
        """The OTel sink; it binds /metrics now, so a port in use fails before any training."""
        t = self.telemetry
        try:
            otlp = otlp_exporter_from_env()
        except ValueError as e:
            raise SentinelSetupError(str(e)) from None
        if not t.prometheus and otlp is None:
            return None
        try:
            return OTelSink((t.prometheus_host, t.prometheus_port) if t.prometheus else None, otlp,
                            t.otlp_export_interval_s, t.linger_s)
        except OSError as e:  # the sink's message names the service's config keys: say the callback's
            raise SentinelSetupError(str(e).replace("telemetry.prometheus_port", "telemetry={'prometheus_port': ...}")
                                     .replace("telemetry.prometheus=false", "telemetry={'prometheus': False}")) from None

    @property
    def metrics_port(self) -> int | None:
        """Where this process serves /metrics (None: it does not)."""
        return self._otel.prometheus_port if self._otel else None

    @staticmethod
    def wrap_rewards(reward_funcs):
        """The same reward functions, recording what each returns for each completion (the callback turns
        it into per-completion metrics and traces). Give TRL the result; call it on every rank (the same
        script does). Reward models cannot be wrapped: their scores never pass through Python."""
        funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
        for i, f in enumerate(funcs):
            if isinstance(f, (str, torch.nn.Module)) or not callable(f):
                what = f"a model id ({f!r})" if isinstance(f, str) else (
                    "a reward model" if callable(f) else f"not callable ({type(f).__name__})")
                raise SentinelSetupError(f"wrap_rewards: reward_funcs[{i}] is {what}; it records Python reward "
                                         "functions only. Leave reward_funcs unwrapped: the callback then reads TRL's "
                                         "logged means")
        names = [_name(f) for f in funcs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise SentinelSetupError(f"wrap_rewards: two reward functions are named {twice[0]!r}; TRL logs both under "
                                     f"rewards/{twice[0]}/mean. Give them different names")
        _RECORDER.names = tuple(names)
        wrapped = [f if getattr(f, "sentinel_wrapped", False) else _wrap(f, n) for f, n in zip(funcs, names)]
        return wrapped if isinstance(reward_funcs, list) else wrapped[0]

    # -- TRL's events (every rank) ------------------------------------------------------------

    def on_train_begin(self, args, state, control, **kwargs):
        if self._run is not None:  # the previous train() raised: transformers calls no on_train_end then
            self._run.close(self._run.last_logged, "failed", "trainer.train() raised; the record holds the rows "
                                                             "logged before")
            self._release()
        problems = _config_problems(args)
        if problems:
            self._release()  # nothing will train: give /metrics' port back
            raise SentinelSetupError("SentinelCallback cannot read this trainer's config:\n"
                                     + "\n".join(f"  - {p}" for p in problems))
        _RECORDER.start()
        if not state.is_world_process_zero:
            if self._otel is not None:  # the launcher's RANK said zero, the trainer says otherwise
                self._otel.close()
                self._otel = None
            return
        if not self._prepared:  # a second train(), or a launcher that set no RANK
            self._prepare()
        self._run = _Run(self, args, state, kwargs.get("model"), kwargs.get("processing_class"))
        self.run_dir = self._run.dir

    def on_step_begin(self, args, state, control, **kwargs):
        _RECORDER.in_step = True

    def on_step_end(self, args, state, control, **kwargs):
        _RECORDER.in_step = False

    def on_log(self, args, state, control, logs=None, **kwargs):
        gens = _gather(_RECORDER.take()) if _RECORDER.names else []
        action = self._run.log(state, control, logs or {}, gens, kwargs) if self._run else ""
        action = _broadcast(action)
        if action:
            control.should_training_stop = True
            if action == "stop":  # a success: keep the checkpoint (TRL saves at this step)
                control.should_save = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        _RECORDER.listening = False
        if self._run is not None:
            self._run.close(state.global_step)
            self._release()

    def _release(self) -> None:
        """Forget this process's run and unbind /metrics; the next train() prepares again."""
        if self._otel is not None:
            self._otel.close()  # a no-op when the run's close already closed it
        self._run = self._otel = None
        self._prepared = False


class _Run:
    """Process zero's side of one trainer.train(): the run directory, its RunSession (the sinks, the
    monitor, the summary: telemetry/session.py), and the mapping of TRL's logs onto its rows."""

    def __init__(self, cb: SentinelCallback, args, state, model, processing_class):
        if model is None:
            raise SentinelSetupError("on_train_begin got no model: SentinelCallback reads a GRPOTrainer")
        self.cb, self.args = cb, args
        self.dir = _new_run_dir(cb.out_dir, cb.run_id, args.seed)
        self.last_logged = state.global_step  # a row covers the steps since the previous one
        self.ln_vocab, self.stop_tokens, self.model_name = _model_facts(model, processing_class)
        # New completions per optimizer step (a generation batch serves num_iterations steps), and per row.
        self.completions_per_step = (args.per_device_train_batch_size * args.world_size
                                     * args.gradient_accumulation_steps / args.num_iterations)
        self.logging_steps = state.logging_steps if _value(args.logging_strategy) == "steps" else 1
        self.setup: Setup | None = None  # from the first log: it names the reward functions
        self.pending: StepStats | None = None  # a row waiting for the evaluation TRL runs right after it
        self.gens: list[Generation] = []
        self.sampled = bool(_RECORDER.names)  # wrapped rewards give per-completion values
        self.curve_at_evals = False
        self.rows = 0
        self.action = self.because = ""
        self.unrecorded: dict[str, str] = {}
        self.trl_train: dict[str, float] = {}
        self.closed = False
        (self.dir / "trl-args.json").write_text(args.to_json_string())
        self.session = RunSession(self.dir, steps=state.max_steps, world_size=args.world_size,
                                  sinks=[cb._otel] if cb._otel else [], traces=trace_sink(cb.traces), health=cb.health,
                                  origin={"trainer": "trl", "trl_version": cb.trl_version})
        self.session.begin(state.global_step, metrics_port=cb.metrics_port, logging_steps=state.logging_steps,
                           rows=f"each row of steps.csv holds TRL's means over its steps_in_row optimizer steps "
                                f"(logging_steps={state.logging_steps}; grad_norm and lr: the row's last step)")
        atexit.register(self._exit)
        # Once, where a user of a script sees it (a library's INFO log is off by default): where everything goes.
        host = cb.telemetry.prometheus_host
        print(f"grpo-sentinel: the run record is in {self.dir} (steps.csv, summary.json; `grpo-sentinel diagnose "
              f"{self.dir}` reads it)" + (f"; metrics at http://{host}:{cb.metrics_port}/metrics" if cb.metrics_port
                                         else ""), file=sys.stderr, flush=True)

    # -- one log ---------------------------------------------------------------------------------

    def log(self, state, control, logs: dict, gens: list[Generation], kwargs: dict) -> str:
        """The health action this log calls for ('', 'stop', 'halt'); never raises into TRL."""
        try:
            return self._log(state, control, logs, gens, kwargs)
        except Exception:  # noqa: BLE001 - telemetry never stops training
            self.session.errors += 1
            if self.session.errors == 1:
                log.exception("SentinelCallback: recording step %d failed; TRL trains on (failures are counted in "
                              "summary.json, telemetry_errors)", state.global_step)
            return ""

    def _log(self, state, control, logs: dict, gens: list[Generation], kwargs: dict) -> str:
        what = trl_stats.kind(logs)
        self.gens += gens
        if what == "summary":
            self.trl_train = {k: v for k, v in logs.items() if isinstance(v, (int, float)) and math.isfinite(v)}
            return ""
        if what == "other" or (self.setup is None and not self._start(trl_stats.reward_names(logs))):
            return ""
        if what == "train":
            self.unrecorded.update(trl_stats.unrecorded(logs))
            stats = trl_stats.step_stats(state.global_step, logs, self.setup, state.global_step - self.last_logged,
                                         self._samples())
            self.last_logged = state.global_step
            earlier = self._emit(self.pending) if self.pending else ""  # its evaluation never came
            self.pending = None
            if control.should_evaluate:  # TRL evaluates right after this log: the row waits for it
                self.pending = stats
                return earlier
            action = self._emit(stats)
            return earlier or action
        ev = trl_stats.evaluation(logs, self.setup, _eval_n(self.args, kwargs))
        if self.pending is not None and self.pending.step == state.global_step:
            stats, self.pending = self.pending, None
            return self._emit(replace(stats, eval=ev) if ev else stats)
        if ev is None:
            return ""
        if self.rows == 0 and self.pending is None:  # before the first update (eval_on_start): the baseline
            self.session.baseline(ev, state.global_step)
            return ""
        return self._emit(StepStats.partial(state.global_step, steps_in_row=0, eval=ev))  # an evaluation alone

    def _start(self, names: list[str]) -> bool:
        """The session's sinks and monitor, once a log names the reward functions (the record's columns,
        the reward scale). False while no log has."""
        if not names:
            return False
        a, cb = self.args, self.cb
        weights = tuple(float(w) for w in a.reward_weights) if a.reward_weights else (1.0,) * len(names)
        self.setup = Setup(a.num_generations, a.scale_rewards, a.multi_objective_aggregation, tuple(names), weights,
                           self.ln_vocab, self._correctness(names), self.stop_tokens)
        if self.sampled and set(names) != set(_RECORDER.names):
            log.warning("SentinelCallback: TRL's reward functions are %s, the wrapped ones %s; per-completion metrics "
                        "are off (wrap every reward function)", names, list(_RECORDER.names))
            self.sampled = False
        self.curve_at_evals = _value(a.eval_strategy) != "no" and self.setup.correctness is not None
        # Windows count rows, and a row holds logging_steps optimizer steps.
        scales = run_scales(ln_vocab=self.ln_vocab, max_new_tokens=a.max_completion_length,
                            group_size=a.num_generations, prompts_per_step=self.completions_per_step / a.num_generations,
                            rewards=list(zip(names, weights)), window=cb.health.window,
                            steps_per_row=self.logging_steps, largest_reward=cb.max_reward,
                            thresholds=cb.health.thresholds)
        self.session.start(RunInfo(run_id=self.dir.name, model=self.model_name, loss_type=a.loss_type, scales=scales,
                                   world_size=a.world_size, traces_project=cb.traces.project_id,
                                   sampling={"temperature": a.temperature, "top_p": a.top_p,
                                             "max_new_tokens": a.max_completion_length},
                                   sampler=self._sampler(a)))
        return True

    @staticmethod
    def _sampler(a) -> dict[str, str]:
        """What biases the mismatch TRL logs: its sampler, and that the ratio it logs is after its correction."""
        if not getattr(a, "use_vllm", False):
            return {"backend": "trl (transformers generate)"}
        dtype = "bf16" if getattr(a, "bf16", False) else "fp16" if getattr(a, "fp16", False) else "fp32"
        out = {"backend": f"vllm ({getattr(a, 'vllm_mode', 'server')} mode)", "trainer_dtype": dtype}
        if getattr(a, "vllm_importance_sampling_correction", False):
            out["ratio"] = (f"after TRL's {getattr(a, 'vllm_importance_sampling_mode', '')} correction "
                            f"(clip max {getattr(a, 'vllm_importance_sampling_clip_max', '')})")
        return out

    def _correctness(self, names: list[str]) -> str | None:
        wanted = self.cb.correctness
        if wanted is None:
            return next((n for n in names if CORRECTNESS.search(n)), None)
        if wanted not in names:
            log.error("SentinelCallback(correctness=%r) names none of this run's reward functions (%s): train_acc and "
                      "the all-correct / all-wrong split are off", wanted, ", ".join(names))
            return None
        return wanted

    def _samples(self):
        gens, self.gens = self.gens, []
        return trl_stats.samples(gens, self.setup) if gens and self.sampled else None

    def _emit(self, stats: StepStats) -> str:
        """A row through the session's pipeline (verdict, traces, every sink); the health action it calls for."""
        stats, verdict = self.session.step(stats)
        self.rows += 1
        if not self.curve_at_evals and self.rows % CURVE_EVERY == 0:
            self.session.point()
        if verdict is None or not verdict.action:
            return ""
        self.action, self.because = verdict.action, verdict.because
        log.warning("health: %s on %s at step %d (health.%s_on): ending the TRL run", verdict.action, verdict.because,
                    stats.step, verdict.action)
        return verdict.action

    # -- the end ---------------------------------------------------------------------------------

    def close(self, step: int, status: str = "", reason: str = "") -> None:
        """Flush the last rows, close the sinks (bounded), write the summary."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._exit)
        if self.pending is not None:
            self.session.tolerate(self._emit, self.pending)
            self.pending = None
        self.session.point()  # the open window's curve row
        status = {"stop": "stopped_early", "halt": "halted"}.get(self.action) or status or "completed"
        reason = reason or (f"health.{self.action}_on: {self.because}" if self.action else "")
        self.session.close(status, step, reason, trl_keys_not_recorded=self.unrecorded, trl_train=self.trl_train)

    def _exit(self) -> None:
        """At interpreter exit inside trainer.train() (an exception, a signal): close with what was logged."""
        self.close(self.last_logged, "failed", "the process ended inside trainer.train() (an exception or a signal); "
                                               "the record holds the rows logged before")


def _new_run_dir(out_dir: Path, run_id: str | None, seed: int) -> Path:
    if run_id is not None:
        path = out_dir / run_id
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise SentinelSetupError(f"run directory {path} already exists: pick another run_id") from None
        return path
    while True:
        path = out_dir / runfiles.new_run_id(out_dir, seed, prefix="trl-")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:  # another run took that name between the look and the mkdir
            continue


def _model_facts(model, processing_class) -> tuple[float, frozenset[int], str]:
    """ln V (the entropy scale), the tokens that end a completion (TRL: EOS ids and the pad id), the model's name."""
    try:
        vocab = model.get_output_embeddings().weight.shape[0]
    except AttributeError:
        vocab = model.config.vocab_size
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if isinstance(eos, list) else [eos]
    stop = {t for t in (*eos, getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None))
            if t is not None}
    return math.log(vocab), frozenset(stop), getattr(model.config, "_name_or_path", "") or type(model).__name__


def _eval_n(args, kwargs: dict) -> int | None:
    """Completions an evaluation scores: each eval prompt num_generations_eval times."""
    try:
        return len(kwargs["eval_dataloader"].dataset) * (args.num_generations_eval or args.num_generations)
    except (KeyError, TypeError, AttributeError):
        return None
