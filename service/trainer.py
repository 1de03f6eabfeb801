"""One run: load, restore, step, evaluate, record, checkpoint, finish.

The lifecycle is explicit so that any entry point can drive it: `open()` loads the model and
restores the newest complete checkpoint (or measures the step-0 baseline), `step()` runs one step
and everything that follows it (health verdict, traces, sinks, checkpoint), `close()` ends the run
and writes its summary. `request_stop()` may be called from a signal handler or another thread: the
run checkpoints at the next step boundary, and a step still waiting on its rewards is abandoned
(a resume redoes it exactly). Signal handlers belong to the entry points (the CLI, the daemon).

The telemetry half of all this (the sinks and the monitor, the per-step pipeline, the book of
baseline, evaluations and conditions, run.json, summary.json, events.jsonl) is rank 0's `RunSession`
(telemetry/session.py), the one the TRL callback holds too; the trainer keeps the model, the step,
checkpoints (which carry the session's book) and ranks.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import math
import shutil
import threading
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from grpo_sentinel.service import checkpoint
from grpo_sentinel.service.config import DEMO, Config, SetupError
from grpo_sentinel.service.cpu import CpuShare
from grpo_sentinel.service.data import BatchSampler, Datasets, Example, Verifier, fit_prompts, load_datasets
from grpo_sentinel.service.distributed import SINGLE, Dist
from grpo_sentinel.service.grpo.rollout import sample
from grpo_sentinel.service.grpo.step import Policy, grpo_step
from grpo_sentinel.service.rewards import RewardScorer, StepAbandoned
from grpo_sentinel.service.runs import EXIT_CODES, EXIT_DISK, Interrupted, RunDir, RunDirError
from grpo_sentinel.telemetry.record import recorded_steps
from grpo_sentinel.telemetry.schema import Eval, Generations, RunInfo, StepStats
from grpo_sentinel.telemetry.session import Book, RunSession, StepSink, run_scales
from grpo_sentinel.telemetry.traces import TraceSink

log = logging.getLogger(__name__)


class DiskFull(RuntimeError):
    """A write into the run directory failed for lack of space; the newest complete checkpoint stays."""


@dataclass
class LoopState:
    """Everything the loop needs besides weights, optimizer and the telemetry Book to continue exactly."""

    step: int = 0
    cursor: int = 0  # position in the (seed, epoch)-shuffled prompt stream
    consecutive_faults: int = 0
    faults: dict[str, int] = field(default_factory=dict)  # skipped updates by reason


# A checkpoint's loop state holds LoopState's fields and rank 0's telemetry Book (baseline, evaluations,
# conditions, invalid rewards): a resume continues both.
_BOOK = tuple(f.name for f in fields(Book))


@dataclass(frozen=True)
class RunResult:
    status: str  # completed | stopped_early | preempted | halted | failed
    run_dir: Path
    step: int
    exit_code: int
    reason: str = ""


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """Each step's randomness derives from (seed, step, rank) alone, so a resumed step samples exactly
    what the uninterrupted run sampled, whatever happened to the process in between."""
    return (seed * 1_000_003 + step + rank * 7_919_993) % (2**63)


@dataclass(frozen=True)
class ModelSource:
    """Where the weights are and what they will meet, checked before they load."""

    path: Path
    device: str
    tokenizer: object
    context: int | None  # max positions of the model, if its config says


def resolve_model(cfg: Config, local_rank: int | None = None) -> ModelSource:
    """Tokenizer, device and LoRA targets checked against the model's config (instantiated on the meta
    device: no weights, no memory), so a mistake fails in seconds, not after a multi-GB load. With
    several ranks on a node, rank r's CUDA device is cuda:<local rank>."""
    from grpo_sentinel.service.demo import demo_model_dir

    path = demo_model_dir() if cfg.model.path == DEMO else Path(cfg.model.path).expanduser()
    device = cfg.model.device if cfg.model.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if local_rank is not None and device.startswith("cuda"):
        device = f"cuda:{local_rank}"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise SetupError(f"model.device={cfg.model.device}: this machine has no CUDA device (torch "
                             f"{torch.__version__}); use model.device=cpu or auto")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise SetupError(f"model.device={device}: only {torch.cuda.device_count()} CUDA device(s) here")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise SetupError(f"model.path={cfg.model.path}: cannot load its tokenizer or config ({e})") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in skeleton.named_modules() if isinstance(m, torch.nn.Linear)})
    names = [n for n, _ in skeleton.named_modules()]
    missing = [t for t in cfg.model.lora.target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise SetupError(f"model.lora.target_modules: {missing} match no module of {config.model_type}; "
                         f"its linear layers are {linear}")
    return ModelSource(path, device, tokenizer, getattr(config, "max_position_embeddings", None))


def build_policy(cfg: Config, source: ModelSource | None = None, dist: Dist = SINGLE) -> Policy:
    src = source or resolve_model(cfg)
    if torch.device(src.device).type == "cpu":
        keep_freed_memory()
    base = AutoModelForCausalLM.from_pretrained(src.path, dtype=getattr(torch, cfg.model.dtype)).to(src.device)
    lora = cfg.model.lora
    torch.manual_seed(cfg.run.seed)  # LoRA A is randomly initialised: same seed, same run
    with warnings.catch_warnings():  # peft <= 0.21 reads a property transformers 5 deprecated: not the user's to fix
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        model = get_peft_model(base, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                                target_modules=lora.target_modules, task_type="CAUSAL_LM"))
    o = cfg.optim
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=o.lr, betas=o.betas, weight_decay=o.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, o.warmup_steps, cfg.run.steps, o.schedule))
    dist.same_as_rank0(trainable)  # seeded alike anyway; from here the same update keeps every rank identical
    return Policy(model, src.tokenizer, optimizer, scheduler, o.max_grad_norm)


def keep_freed_memory() -> None:
    """Training on the CPU: keep freed memory in the process, as the CUDA caching allocator does on a GPU.

    glibc's malloc hands large blocks (128 KiB to 32 MiB, its threshold adapts) back to the kernel when they
    are freed, so each step's activations are fresh pages that fault in one by one: ~5,000 page faults per
    32-token demo step, 4-10 % of its CPU time (docs/benchmarks.md). Blocks up to 32 MiB (glibc's largest
    mmap threshold) now come from the heap, which is trimmed only above 1 GiB free. Elsewhere than glibc, a no-op.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD


def run_info(cfg: Config, run_dir: Path, policy: Policy, attempt: int = 1, world_size: int = 1) -> RunInfo:
    vocab = policy.model.get_output_embeddings().weight.shape[0]
    g = cfg.grpo
    scales = run_scales(ln_vocab=math.log(vocab), max_new_tokens=g.max_new_tokens, group_size=g.group_size,
                        prompts_per_step=g.prompts_per_step, rewards=[(r.name, r.weight) for r in cfg.rewards],
                        window=cfg.health.window, thresholds=cfg.health.thresholds)
    # The model's name, not its path: the run info reaches open /metrics and traces.
    return RunInfo(run_id=run_dir.name, model=Path(cfg.model.path).name, loss_type=g.loss_type, scales=scales,
                   attempt=attempt, world_size=world_size, traces_project=cfg.traces.project_id,
                   sampling={"temperature": g.temperature, "top_p": g.top_p, "max_new_tokens": g.max_new_tokens},
                   sampler=sampler_context(cfg))


def sampler_context(cfg: Config) -> dict[str, str]:
    """What biases the train/inference mismatch this run measures (the health row's evidence names it)."""
    r = cfg.rollout
    dtype = cfg.model.dtype if r.backend == "hf" or r.vllm.dtype == "auto" else r.vllm.dtype
    return {"backend": r.backend, "sampler_dtype": dtype, "trainer_dtype": cfg.model.dtype,
            "ratio": "raw" if cfg.grpo.is_correction == "none" else f"raw; the loss weighs it by {cfg.grpo.is_correction}"}


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
    gens = {
        mode: Generations(
            tuple(o["texts"]),
            np.array([verifier.is_correct(t, e.answer) for t, e in zip(o["texts"], heldout)]),
            torch.cat(o["tokens"]).numpy(),
        )
        for mode, o in out.items()
    }
    return Eval(sample_acc=float(gens["sampled"].correct.mean()), greedy_acc=float(gens["greedy"].correct.mean()),
                n=len(heldout), prompts=tuple(e.prompt for e in heldout), answers=tuple(e.answer for e in heldout),
                prompt_tokens=torch.cat(prompt_tokens).numpy(), generations=gens)


class Trainer:
    def __init__(self, cfg: Config, run: RunDir, sinks: Sequence[StepSink] = (), traces: TraceSink | None = None,
                 dist: Dist = SINGLE):
        self.cfg, self.run, self.dist = cfg, run, dist
        # Rank 0 alone records, watches, traces and checkpoints; every rank trains its shard.
        self.session = RunSession(run.path, steps=cfg.run.steps, world_size=dist.world, sinks=sinks, traces=traces,
                                  health=cfg.health, guard=self._disk) if dist.main else None
        self._stop_reason: str | None = None
        self._stop = threading.Event()  # set by request_stop(): the scorer stops waiting on rewards
        self.data: Datasets = load_datasets(cfg.data, cfg.run.seed)  # before the model: bad data fails fast
        # Abandoning a step that waits on its rewards is for one process only: other ranks would wait
        # for this one in the step's collectives. With several, a stop takes effect at the step boundary.
        self.scorer = RewardScorer(cfg.rewards, Verifier(cfg.data.verifier), cfg.grpo,
                                   self._stop if dist.world == 1 else None)
        self.sampler = BatchSampler(len(self.data.train), cfg.run.seed)
        self._healthy = True  # no critical condition active: checkpoints also become `last-healthy`
        self.policy: Policy | None = None
        self.state = LoopState()
        self._saved_step = 0  # the step of the newest complete checkpoint: the resume point
        self.cpu: CpuShare | None = None  # this process's share of its cores, while the run is open
        self.engine = None  # the rollout backend when it is not our decoder (rollout.backend: vllm)

    @property
    def run_dir(self) -> Path:
        return self.run.path

    # -- lifecycle -----------------------------------------------------------------------------

    def run_to_end(self) -> RunResult:
        if not self.open():
            return RunResult("completed", self.run_dir, self.state.step, EXIT_CODES["completed"])
        return self.loop()

    def loop(self) -> RunResult:
        """Step until the run ends, then close; whatever ends it, the run closes with a summary."""
        try:
            while (status := self.step()) is None:
                pass
        except DiskFull as e:
            return self.close("failed", str(e), EXIT_DISK)
        except Interrupted as e:
            status = self._interrupted_status()
            self.close(status, self.run.stop_marked if status == "stopped" else str(e))
            raise
        except BaseException as e:
            self.close("failed", f"{type(e).__name__}: {e}")
            raise
        return self.close(status, self.run.stop_marked if status == "stopped" else "")

    def open(self) -> bool:
        """Load the model, restore the newest complete checkpoint or measure the step-0 baseline, and
        start the sinks. False: the run has already finished; nothing to do."""
        cfg, dist = self.cfg, self.dist
        summary = self.run.read_summary() if dist.main else {}
        ckpt = checkpoint.latest(self.run_dir / "checkpoints") if dist.main else None
        # Done when the summary says so, or when a checkpoint already holds the last step whatever the
        # summary says (a signal in the moment between the final summary and the exit): never a step more.
        done = max(summary.get("step", 0) if summary.get("status") == "completed" else -1, ckpt.step if ckpt else -1)
        done = dist.broadcast(done)
        if done >= cfg.run.steps:
            log.info("run %s already finished at step %d; nothing to do", self.run_dir, done)
            if dist.main and summary.get("status") != "completed":
                self.run.update_summary(status="completed", step=done, reason="")
                self.run.event("ended", status="completed", step=done, reason="found finished at a restart")
            self.state.step = done
            return False
        for note in self.data.notes if dist.main else ():
            log.warning("data: %s", note)
        self.cpu = CpuShare(cfg.run.cpu_threads).__enter__()
        try:
            return self._load(summary, ckpt)
        except BaseException:
            self._release_cpu()
            raise

    def _load(self, summary: dict, ckpt: checkpoint.Checkpoint | None) -> bool:
        """open()'s second half, on this process's share of its cores: the model, then the checkpoint or the
        baseline, then the sinks."""
        cfg, dist = self.cfg, self.dist
        source = resolve_model(cfg, dist.local_rank if dist.world > 1 else None)
        limit = cfg.data.max_prompt_tokens or (source.context - cfg.grpo.max_new_tokens if source.context else None)
        if limit is not None:
            if limit < 1:
                raise SetupError(f"grpo.max_new_tokens={cfg.grpo.max_new_tokens} leaves no room for a prompt in the "
                                 f"model's context of {source.context} tokens")
            self.data = fit_prompts(self.data, source.tokenizer, limit, cfg.data.long_prompts)
        self.policy = build_policy(cfg, source, dist)
        resumed = self._restore(ckpt)
        if cfg.rollout.backend == "vllm":
            self._start_engine(source)
        if not dist.main:
            return True
        # Each start is the next attempt, on disk before anything is traced (trace ids carry it).
        session = self.session
        attempt = summary.get("attempt", 0) + 1
        session.begin(self.state.step, attempt, resumed, **self._summary_fields())
        info = run_info(cfg, self.run_dir, self.policy, attempt, dist.world)
        session.start(info, self.state.step if resumed else None)
        if not resumed:
            ev = evaluate(self.policy, self.data.heldout, cfg)
            session.baseline(ev)
            log.info("step 0 baseline: sample_acc %.3f greedy_acc %.3f (n=%d)", ev.sample_acc, ev.greedy_acc, ev.n)
        session.reset_clock()  # seconds_this_session: the loop's own time
        return True

    def _start_engine(self, source: ModelSource) -> None:
        """vLLM's engine on the base model, with the policy's adapter as it is now (a resume's, or the fresh one).
        On a CPU its worker takes one of our cores and this process the others (cpu.py)."""
        from grpo_sentinel.service.grpo.vllm_rollout import VLLMSampler

        core = self.cpu.spare_core() if torch.device(source.device).type == "cpu" else None
        self.engine = VLLMSampler(self.cfg, source.path, source.tokenizer, self.run_dir / "rollout-adapter", core)
        if core is not None:
            self.cpu.give_up(core)
        self.engine.hand_over(self.policy.model, self.state.step)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Checkpoint at the next step boundary and end the run: `preempted` (resume it), or `stopped` when
        the run directory is marked so (a stop through the daemon's API). Safe from any thread."""
        self._stop_reason = reason
        self._stop.set()

    def step(self) -> str | None:
        """One step and what follows it; the run's final status when it ends here, else None. Every rank
        ends at the same step boundary: a stop on any rank stops all, and rank 0's decisions (a health
        action, the fault limit, a checkpoint, the end) are every rank's."""
        dist = self.dist
        self.cpu.adjust()  # another training process may have started on (or left) our cores
        if dist.any(self._stop_reason is not None, self.policy.device):
            self._stop_reason = self._stop_reason or "a stop on another rank"
            return self._stopped()
        try:
            stats = self._train_one()
        except StepAbandoned:
            return self._stopped()
        status, save = self._after(stats) if dist.main else (None, False)
        status, save = dist.broadcast((status, save))
        if save:
            self._checkpoint()
        return status

    def _after(self, stats: StepStats) -> tuple[str | None, bool]:
        """Rank 0, after a step: the health verdict, the record and every sink; then (final status or
        None, checkpoint now?)."""
        cfg, st = self.cfg, self.state
        stats, verdict = self.session.step(stats)
        if verdict is not None:
            self._healthy = not verdict.critical
        if st.consecutive_faults >= cfg.run.max_consecutive_faults:
            log.error("halting: %d skipped updates in a row (last: %s)", st.consecutive_faults, stats.skipped)
            return "halted", True
        if verdict is not None and verdict.action:
            log.warning("health: %s on %s at step %d (health.%s_on)", verdict.action, verdict.because, st.step,
                        verdict.action)
            return ("halted" if verdict.action == "halt" else "stopped_early"), True
        save = st.step % cfg.run.checkpoint_every == 0 or st.step >= cfg.run.steps
        return ("completed" if st.step >= cfg.run.steps else None), save

    def close(self, status: str, reason: str = "", exit_code: int | None = None) -> RunResult:
        """End the run: close the sinks (bounded), write the summary and the event, release the run."""
        code = EXIT_CODES[status] if exit_code is None else exit_code
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        self._release_cpu()
        if not self.dist.main:
            return RunResult(status, self.run_dir, self._saved_step, code, reason)
        self.session.close(status, self._saved_step, reason, **self._summary_fields())
        self.run.unlock()
        return RunResult(status, self.run_dir, self._saved_step, code, reason)

    def _release_cpu(self) -> None:
        if self.cpu is not None:
            self.cpu.__exit__(None, None, None)
            self.cpu = None

    # -- one step ------------------------------------------------------------------------------

    def _train_one(self) -> StepStats | None:
        """One GRPO step on this rank's whole prompts; the whole step's statistics on rank 0, None elsewhere."""
        cfg, st, dist = self.cfg, self.state, self.dist
        step = st.step + 1
        torch.manual_seed(step_seed(cfg.run.seed, step, dist.rank))
        # The data cursor and the step seeds are global: a run resumes at another world size.
        batch = [self.data.train[i] for i in self.sampler.batch(st.cursor, cfg.grpo.prompts_per_step)]
        share = len(batch) // dist.world
        stats = grpo_step(self.policy, self.scorer, batch[dist.rank * share:(dist.rank + 1) * share], cfg.grpo,
                          step, dist, self.engine)
        st.step, st.cursor = step, st.cursor + len(batch)
        if self.engine is not None:  # the engine samples the next step with the weights this one made
            self.engine.hand_over(self.policy.model, step)
        if stats is None:
            return None
        if stats.skipped:
            st.consecutive_faults += 1
            st.faults[stats.skipped] = st.faults.get(stats.skipped, 0) + 1
            log.warning("step %d: update skipped (%s), %d in a row", step, stats.skipped, st.consecutive_faults)
        else:
            st.consecutive_faults = 0
        if step % cfg.run.sample_every == 0 or step == cfg.run.steps:
            stats = replace(stats, eval=evaluate(self.policy, self.data.heldout, cfg))
        return stats

    def _stopped(self) -> str:
        status = self._interrupted_status()
        log.warning("%s: checkpointing at step %d and exiting%s", self._stop_reason, self.state.step,
                    f" (resume with --resume {self.run_dir})" if status == "preempted" else ": stopped")
        if self._saved_step != self.state.step:
            self._checkpoint()
        return status

    def _interrupted_status(self) -> str:
        """A signal ends the run `preempted` (resume me), unless a stop marked it for good (runs.py)."""
        return "stopped" if self.dist.main and self.run.stop_marked is not None else "preempted"

    # -- persistence ---------------------------------------------------------------------------

    def _disk(self, write, *args):
        """A write into the run directory; a full disk ends the run with a clear error (DiskFull)."""
        try:
            return write(*args)
        except OSError as e:
            if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            free = shutil.disk_usage(self.run_dir).free
            newest = self.run_dir / "checkpoints" / f"step-{self._saved_step:08d}"
            need = sum(f.stat().st_size for f in newest.rglob("*") if f.is_file()) if newest.is_dir() else 0
            raise DiskFull(f"no space left in {self.run_dir} ({free / 2**20:.1f} MiB free"
                           + (f"; a checkpoint needs ~{need / 2**20:.1f} MiB" if need else "")
                           + f"): free space, then --resume {self.run_dir} (it continues from step {self._saved_step})") from None

    def _checkpoint(self) -> None:
        """Rank 0 writes (the adapter and optimizer are identical on every rank); every rank waits for
        it, so a run that ends here ends with its checkpoint on disk, and learns whether it failed."""
        saved, failure = False, None
        if self.dist.main:
            try:
                saved = self._save()
            except DiskFull as e:
                failure = e
        saved, failure = self.dist.broadcast((saved, failure))
        if failure is not None:
            raise failure
        if saved:
            self._saved_step = self.state.step

    def _save(self) -> bool:
        p = self.policy
        loop = {**asdict(self.state), **asdict(self.session.book)}
        try:
            saved = self._disk(checkpoint.save, self.run_dir / "checkpoints", self.state.step, p.model, p.optimizer,
                               p.scheduler, loop, self.cfg.run.keep_checkpoints)
        except checkpoint.CheckpointError as e:  # the previous clean checkpoint stays the resume point
            log.error("%s", e)
            return False
        if self._healthy:  # a rollback target that no critical condition had touched
            self._disk(checkpoint.mark_last_healthy, saved)
        self.session.flush()  # bounded: after a crash, only the steps the resume re-does lack their traces
        return True

    def _restore(self, ckpt: checkpoint.Checkpoint | None) -> bool:
        """Every rank loads the newest complete checkpoint rank 0 found (whatever world size wrote it)."""
        ckpt = self.dist.broadcast(ckpt)
        if ckpt is None:
            return False
        p = self.policy
        problem = ""
        try:
            loop = checkpoint.load(ckpt, p.model, p.optimizer, p.scheduler)
            self.state = LoopState(**{k: v for k, v in loop.items() if k not in _BOOK})
            if self.session:
                self.session.book = Book(**{k: loop[k] for k in _BOOK})
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            problem = f"{ckpt.path} does not fit this model and config ({e}); the run cannot resume with them"
        if self.dist.main and not problem:
            recorded = recorded_steps(self.run_dir / "steps.csv") if (self.run_dir / "steps.csv").is_file() else []
            if recorded[: self.state.step] != list(range(1, self.state.step + 1)):
                problem = (f"{self.run_dir / 'steps.csv'} lacks some of steps 1-{self.state.step} that the checkpoint "
                           "has trained: the record is damaged; restore it or start a new run")
        problems = self.dist.all_gather(problem)
        if any(problems):
            raise RunDirError(next(p for p in problems if p))
        self._saved_step = self.state.step
        log.info("resuming from %s (step %d)", ckpt.path, self.state.step)
        return True

    def _summary_fields(self) -> dict:
        """What summary.json says of this trainer beyond what every trainer's session says."""
        return {"skipped_updates": self.state.faults, "data_notes": list(self.data.notes)}
