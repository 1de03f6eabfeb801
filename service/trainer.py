"""The training loop: step, evaluate, record, checkpoint; stop cleanly on SIGTERM/SIGINT."""

from __future__ import annotations

import json
import logging
import math
import signal
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_sentinel.service import checkpoint
from grpo_sentinel.service.config import DEMO, Config
from grpo_sentinel.service.data import BatchSampler, Datasets, Example, Verifier, load_datasets
from grpo_sentinel.service.grpo.rollout import sample
from grpo_sentinel.service.grpo.step import Policy, grpo_step
from grpo_sentinel.service.record import RunRecord
from grpo_sentinel.service.rewards import RewardScorer
from grpo_sentinel.telemetry.drops import DROPS
from grpo_sentinel.telemetry.health import ingest
from grpo_sentinel.telemetry.health.detectors import Thresholds, auto_window
from grpo_sentinel.telemetry.health.monitor import HealthMonitor
from grpo_sentinel.telemetry.interface import StepSink
from grpo_sentinel.telemetry.schema import Eval, Generations, RunInfo, Scales, StepStats
from grpo_sentinel.telemetry.traces import TraceSink

log = logging.getLogger(__name__)

EXIT_COMPLETED, EXIT_HALTED, EXIT_PREEMPTED = 0, 3, 75  # 75 = EX_TEMPFAIL: "run me again"
EXIT_CODES = {"completed": EXIT_COMPLETED, "stopped_early": EXIT_COMPLETED, "halted": EXIT_HALTED,
              "preempted": EXIT_PREEMPTED}


@dataclass
class LoopState:
    """Everything the loop needs besides weights and optimizer to continue exactly."""

    step: int = 0
    cursor: int = 0  # position in the (seed, epoch)-shuffled prompt stream
    consecutive_faults: int = 0
    faults: dict[str, int] = field(default_factory=dict)  # skipped updates by reason
    invalid_rewards: int = 0
    baseline: dict | None = None  # Eval at step 0
    last_eval: dict | None = None
    last_eval_step: int = 0
    conditions: dict[str, int] = field(default_factory=dict)  # health condition -> first step it was active


@dataclass(frozen=True)
class RunResult:
    status: str  # completed | stopped_early | preempted | halted
    run_dir: Path
    step: int
    exit_code: int


def step_seed(seed: int, step: int) -> int:
    """Each step's randomness derives from (seed, step) alone, so a resumed step samples exactly what
    the uninterrupted run sampled, whatever happened to the process in between."""
    return (seed * 1_000_003 + step) % (2**63)


def build_policy(cfg: Config) -> Policy:
    from grpo_sentinel.service.demo import demo_model_dir

    path = demo_model_dir() if cfg.model.path == DEMO else Path(cfg.model.path).expanduser()
    device = cfg.model.device if cfg.model.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    base = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, cfg.model.dtype)).to(device)
    lora = cfg.model.lora
    torch.manual_seed(cfg.run.seed)  # LoRA A is randomly initialised: same seed, same run
    model = get_peft_model(base, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                            target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    o = cfg.optim
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, o.warmup_steps, cfg.run.steps, o.schedule))
    return Policy(model, tokenizer, optimizer, scheduler, o.max_grad_norm)


def run_info(cfg: Config, run_dir: Path, policy: Policy, attempt: int = 1) -> RunInfo:
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    max_reward = max(1.0, sum(max(r.weight, 0.0) for r in cfg.rewards))
    g = cfg.grpo
    return RunInfo(run_id=run_dir.name, model=cfg.model.path, loss_type=g.loss_type,
                   scales=Scales(max_reward=max_reward, ln_vocab=math.log(vocab), max_new_tokens=g.max_new_tokens),
                   attempt=attempt, sampling={"temperature": g.temperature, "top_p": g.top_p,
                                              "max_new_tokens": g.max_new_tokens})


def lr_factor(step: int, warmup: int, total: int, schedule: str) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1 - progress)
    if schedule == "cosine":
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return 1.0


@torch.no_grad()
def evaluate(policy: Policy, heldout: list[Example], cfg: Config, batch: int = 256) -> Eval:
    """Accuracy on the fixed held-out subset: sampled at the training temperature with a fixed seed, and greedy."""
    verifier = Verifier(cfg.data.verifier)
    g = cfg.grpo
    out = {mode: {"texts": [], "tokens": []} for mode in ("sampled", "greedy")}
    prompt_tokens = []
    torch.manual_seed(cfg.run.eval_seed)
    for i in range(0, len(heldout), batch):
        part = heldout[i : i + batch]
        for mode, o in out.items():
            roll = sample(policy.model, policy.tokenizer, [e.prompt for e in part], max_new_tokens=g.max_new_tokens,
                          temperature=g.temperature, top_p=g.top_p, greedy=mode == "greedy")
            o["texts"] += roll.texts
            o["tokens"].append(roll.lengths.cpu())
        prompt_len = roll.input_ids.shape[1] - roll.completion_ids.shape[1]
        prompt_tokens.append(roll.attention_mask[:, :prompt_len].sum(1).cpu())
    gens = {mode: Generations(tuple(o["texts"]), np.array([verifier.is_correct(t, e.answer) for t, e in zip(o["texts"], heldout)]),
                              torch.cat(o["tokens"]).numpy())
            for mode, o in out.items()}
    return Eval(sample_acc=float(gens["sampled"].correct.mean()), greedy_acc=float(gens["greedy"].correct.mean()),
                n=len(heldout), prompts=tuple(e.prompt for e in heldout), answers=tuple(e.answer for e in heldout),
                prompt_tokens=torch.cat(prompt_tokens).numpy(), generations=gens)


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, sinks: Sequence[StepSink] = (), traces: TraceSink | None = None):
        self.cfg, self.run_dir = cfg, run_dir
        self.traces = traces  # also a sink; it plans each step's traces before any sink sees the step
        self.data: Datasets = load_datasets(cfg.data, cfg.run.seed)  # before the model: bad data fails fast
        self.scorer = RewardScorer(cfg.rewards, Verifier(cfg.data.verifier), cfg.grpo)
        self.sampler = BatchSampler(len(self.data.train), cfg.run.seed)
        self.record = RunRecord(run_dir, [r.name for r in cfg.rewards], traces.links.trace if traces else None)
        self.sinks = [self.record, *sinks, *([traces] if traces else [])]
        h = cfg.health
        window = h.window or auto_window(cfg.grpo.prompts_per_step * cfg.grpo.group_size)
        self.monitor = HealthMonitor(frozenset(h.stop_on), frozenset(h.halt_on), Thresholds(window=window),
                                     group_size=cfg.grpo.group_size) if h.enabled else None
        self._healthy = True  # no critical condition active: checkpoints also become `last-healthy`
        self.policy: Policy | None = None
        self.state = LoopState()
        self._stop_signal: int | None = None
        self._saved_step = -1

    # -- lifecycle -----------------------------------------------------------------------------

    def run(self) -> RunResult:
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        summary = self._read_summary()
        if summary.get("status") == "completed" and summary.get("step", 0) >= cfg.run.steps:
            log.info("run %s already finished at step %d; nothing to do", self.run_dir, summary["step"])
            return RunResult("completed", self.run_dir, summary["step"], EXIT_COMPLETED)
        (self.run_dir / "config.yaml").write_text(cfg.to_yaml())
        self.policy = build_policy(cfg)
        # Each start is the next attempt, recorded before anything is traced: trace ids carry it, so a
        # resumed run never re-emits the ids of the steps it re-does.
        self.attempt = summary.get("attempt", 0) + 1
        self._write_summary("running", 0.0)
        info = run_info(cfg, self.run_dir, self.policy, self.attempt)
        for sink in [*self.sinks, self.monitor] if self.monitor else self.sinks:
            sink.start(info)
        resumed = self._restore()
        self.record.open(self.state.step if resumed else None)
        if resumed and self.monitor and self.state.step > 0:
            self.monitor.seed(ingest.load(self.run_dir / "steps.csv"))
        if not resumed:
            ev = evaluate(self.policy, self.data.heldout, cfg)
            self.state.baseline = self.state.last_eval = ev.accuracy()
            base = StepStats.partial(0, eval=ev)
            if self.traces:
                base = replace(base, traces=self.traces.plan(base))
                self.traces.on_step(base)
            self.record.write_baseline(base)
            if self.monitor:
                self.monitor.baseline(ev.sample_acc)
            log.info("step 0 baseline: sample_acc %.3f greedy_acc %.3f (n=%d)", ev.sample_acc, ev.greedy_acc, ev.n)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        t0 = time.monotonic()
        try:
            status = self._loop()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            for sink in self.sinks:
                sink.close()
        self._write_summary(status, time.monotonic() - t0)
        return RunResult(status, self.run_dir, self.state.step, EXIT_CODES[status])

    def _loop(self) -> str:
        cfg, st = self.cfg, self.state
        while st.step < cfg.run.steps:
            if self._stop_signal is not None:
                log.warning("%s: checkpointing at step %d and exiting (resume with --resume %s)",
                            signal.Signals(self._stop_signal).name, st.step, self.run_dir)
                if self._saved_step != st.step:
                    self._checkpoint()
                return "preempted"
            stats = self._train_one()
            verdict = self.monitor.observe(stats) if self.monitor else None
            if verdict is not None:
                stats = replace(stats, health=tuple(c.id for c in verdict.active),
                                health_new=tuple(c.id for c in verdict.new), entropy_baseline=verdict.entropy_baseline)
                self._healthy = not verdict.critical
                for c in verdict.new:
                    st.conditions.setdefault(c.id, c.first_step)
            if self.traces:
                stats = replace(stats, traces=self.traces.plan(stats))
            for sink in self.sinks:
                sink.on_step(stats)
            if st.consecutive_faults >= cfg.run.max_consecutive_faults:
                log.error("halting: %d skipped updates in a row (last: %s)", st.consecutive_faults, stats.skipped)
                self._checkpoint()
                return "halted"
            if verdict is not None and verdict.action:
                log.warning("health: %s on %s at step %d (health.%s_on)", verdict.action, verdict.because, st.step,
                            verdict.action)
                self._checkpoint()
                return "halted" if verdict.action == "halt" else "stopped_early"
            if st.step % cfg.run.checkpoint_every == 0 or st.step == cfg.run.steps:
                self._checkpoint()
        return "completed"

    def _train_one(self) -> StepStats:
        cfg, st = self.cfg, self.state
        step = st.step + 1
        torch.manual_seed(step_seed(cfg.run.seed, step))
        batch = [self.data.train[i] for i in self.sampler.batch(st.cursor, cfg.grpo.prompts_per_step)]
        stats = grpo_step(self.policy, self.scorer, batch, cfg.grpo, step)
        st.step, st.cursor = step, st.cursor + len(batch)
        st.invalid_rewards += stats.invalid_rewards
        if stats.skipped:
            st.consecutive_faults += 1
            st.faults[stats.skipped] = st.faults.get(stats.skipped, 0) + 1
            log.warning("step %d: update skipped (%s), %d in a row", step, stats.skipped, st.consecutive_faults)
        else:
            st.consecutive_faults = 0
        if step % cfg.run.sample_every == 0 or step == cfg.run.steps:
            ev = evaluate(self.policy, self.data.heldout, cfg)
            st.last_eval, st.last_eval_step = ev.accuracy(), step
            stats = replace(stats, eval=ev)
        return stats

    # -- persistence ---------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        p = self.policy
        self._saved_step = self.state.step
        try:
            saved = checkpoint.save(self.run_dir / "checkpoints", self.state.step, p.model, p.optimizer, p.scheduler,
                                    asdict(self.state), self.cfg.run.keep_checkpoints)
        except checkpoint.CheckpointError as e:  # the previous clean checkpoint stays the resume point
            log.error("%s", e)
            return
        if self._healthy:  # a rollback target that no critical condition had touched
            checkpoint.mark_last_healthy(saved)
        if self.traces:  # bounded: after a crash, only the steps the resume re-does lack their traces
            self.traces.flush()

    def _restore(self) -> bool:
        ckpt = checkpoint.latest(self.run_dir / "checkpoints")
        if ckpt is None:
            return False
        p = self.policy
        self.state = LoopState(**checkpoint.load(ckpt, p.model, p.optimizer, p.scheduler))
        log.info("resuming from %s (step %d)", ckpt.path, self.state.step)
        return True

    def _read_summary(self) -> dict:
        path = self.run_dir / "summary.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def _write_summary(self, status: str, seconds: float) -> None:
        st = self.state
        summary = {
            "status": status, "step": st.step, "steps": self.cfg.run.steps, "attempt": self.attempt,
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "seconds_this_session": round(seconds, 1),
            "baseline": st.baseline, "final_eval": st.last_eval, "final_eval_step": st.last_eval_step,
            "skipped_updates": st.faults, "invalid_rewards": st.invalid_rewards,
            "telemetry_dropped": DROPS.report(),  # what metrics and traces could not deliver (also on /metrics)
            "health_conditions": st.conditions,
        }
        tmp = self.run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(self.run_dir / "summary.json")

    def _on_signal(self, signum, frame) -> None:
        if self._stop_signal is not None:  # a second signal: stop waiting for the step boundary
            raise KeyboardInterrupt
        self._stop_signal = signum
        log.warning("received %s: finishing the current step", signal.Signals(signum).name)
