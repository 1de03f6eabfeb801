"""Langfuse traces of the generations behind the metrics: one more StepSink on the per-step record.

What is traced is decided by `plan()`, a pure function of the record, before any sink runs, so the
run record can name the traces of a step (steps.csv `trace_ids`) and the health verdicts can link
the generations that explain them:
- every held-out round (step 0 and every `sample_every` steps): one trace per (round, prompt) for the
  first `eval_prompts` prompts of the fixed held-out set (the same ones every round), with a generation
  per mode (sampled at the training temperature, greedy);
- training rollouts every `train_every` steps: a fraction of the groups (at least one), one trace
  per group with a generation per completion;
- always, at a step where a health condition is active: the groups that explain it (the highest-
  and lowest-reward groups, and those its table row names: health/table.py `Row.traced`), listed first.

Trace ids are deterministic, seeded by (run id, attempt, kind, step, index): a resumed run is the
next attempt, so it never re-emits or overwrites an id, and a link can be written before the trace
is sent. `session_id` is the run id: Langfuse's session page is the run.

What the server reads (Langfuse v4.16 source; tests/langfuse_server.py enforces it): a trace's input,
output and metadata come from its span with no parent, so the root is a parentless span under the
planned trace id, and the trace-level metadata is that root's own metadata (propagated trace metadata
would land on every span, over the generations' own keys). Scores go as `score-create` events to the
ingestion API, in the spans' environment. The spans are the Langfuse SDK's (its attribute names and
encodings), built as finished OpenTelemetry spans without the SDK's per-span machinery, which cost
five times our own work (measured: docs/benchmarks.md); how they travel is telemetry/langfuse_wire.py.

Never in the way of training: `on_step()` only enqueues (a bounded queue: a step that does not fit is
dropped and counted); one worker thread builds each step's spans and scores and sends them in
batches (512 spans, or 5 s after the oldest was built, or at a flush: the SDK's batching); exports
time out, and while Langfuse is unreachable or rejects the keys a signal (spans, scores) is skipped for
a backoff instead of queueing up; a refused batch or score is dropped and counted, never pausing
anything; nothing flushes on the step path, and every flush is bounded.
What cannot be delivered is counted in `grpo_traces_dropped_total{signal, reason}` and reported once
per change of state (wrong keys: one clear error, then only the counter).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import queue
import re
import threading
import time
import urllib.parse
from pathlib import Path

import numpy as np

from grpo_sentinel.telemetry.drops import DROPS
from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.langfuse_wire import (
    DROPPED,
    SPANS_PER_REQUEST,
    CountingSpanExporter,
    Credentials,
    Link,
    Observations,
    ScorePoster,
    new_span_id,
)
from grpo_sentinel.telemetry.links import links
from grpo_sentinel.telemetry.schema import RunInfo, StepStats, TraceRef
from grpo_sentinel.telemetry.settings import TracesSettings

log = logging.getLogger(__name__)

SEND = object()  # a flush's mark in the worker's queue: send what is built
SEND_AFTER_S = 5.0  # the longest a built span waits for others (the OpenTelemetry batch processor's delay)


def trace_id(run_id: str, attempt: int, kind: str, step: int, index: int) -> str:
    """The Langfuse trace id of one traced group or held-out prompt: 32 hex digits, the SDK's
    seeded form (sha256 of the seed), so the same seed always names the same trace."""
    return hashlib.sha256(f"{run_id}/{attempt}/{kind}/{step}/{index}".encode()).hexdigest()[:32]


def _keep(tid: str, rate: float) -> bool:
    """Sampling by trace id: the same trace is kept or not whoever asks."""
    return rate >= 1 or int(tid[:8], 16) / 0xFFFFFFFF < rate


def plan(s: StepStats, cfg: TracesSettings, run_id: str, attempt: int) -> tuple[TraceRef, ...]:
    """Which generations of step `s` are traced, explaining groups first."""
    refs: list[TraceRef] = []
    x = s.samples
    if x is not None and x.prompts:
        reward = np.where(np.isnan(x.reward), -np.inf, x.reward).reshape(len(x.prompts), -1)  # [P, G]
        why: dict[int, str] = {}
        if s.health:
            means = reward.mean(1)
            why.setdefault(int(means.argmax()), "highest reward")
            why.setdefault(int(means.argmin()), "lowest reward")
            traced = {kind for c in s.health if c in BY_ID for kind in BY_ID[c].traced}  # the table says which
            same = np.flatnonzero(x.group_reward_std == 0)
            if "all-same" in traced and same.size and not set(why) & set(same.tolist()):
                why[int(same[0])] = "all-same rewards"
            if "longest" in traced:
                why.setdefault(int(x.length.argmax()) // reward.shape[1], "longest completion")
            why = {g: f"{r} ({' '.join(s.health)})" for g, r in why.items()}
        if s.step % cfg.train_every == 0:
            n = max(1, round(cfg.train_fraction * len(x.prompts)))
            order = np.random.default_rng(int(trace_id(run_id, attempt, "train", s.step, -1)[:8], 16)).permutation(len(x.prompts))
            for g in order[:n]:
                tid = trace_id(run_id, attempt, "train", s.step, int(g))
                if int(g) not in why and _keep(tid, cfg.sample_rate):
                    why[int(g)] = "sampled"
        explaining = sorted((g for g, r in why.items() if r != "sampled"))
        for g in explaining + sorted(g for g, r in why.items() if r == "sampled"):
            refs.append(TraceRef("train", g, trace_id(run_id, attempt, "train", s.step, g), why[g]))
    ev = s.eval
    if ev is not None and ev.prompts:
        for i in range(min(len(ev.prompts), cfg.eval_prompts)):
            tid = trace_id(run_id, attempt, "eval", s.step, i)
            if _keep(tid, cfg.sample_rate):
                refs.append(TraceRef("eval", i, tid, "held-out round"))
    return tuple(refs)


def credentials_from_env() -> Credentials | None:
    public, secret = os.environ.get("LANGFUSE_PUBLIC_KEY"), os.environ.get("LANGFUSE_SECRET_KEY")
    if not (public and secret):
        return None
    base = os.environ.get("LANGFUSE_BASE_URL") or os.environ.get("LANGFUSE_HOST") or "https://cloud.langfuse.com"
    return Credentials(public, secret, base.rstrip("/"))


def trace_sink(cfg: TracesSettings) -> TraceSink | None:
    """The sink when traces are enabled and the keys are in the environment; else None, said once."""
    if not cfg.enabled:
        return None
    creds = credentials_from_env()
    if creds is None:
        log.info("Langfuse traces off: LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY are not set")
        return None
    return TraceSink(cfg, creds)


def _redact(data, patterns: list[re.Pattern]):
    """Every string in input, output and metadata, before it is encoded."""
    if isinstance(data, str):
        for p in patterns:
            data = p.sub("[REDACTED]", data)
        return data
    if isinstance(data, dict):
        return {k: _redact(v, patterns) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_redact(v, patterns) for v in data]
    return data


def clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else f"{text[:max_chars]}[... {len(text) - max_chars} more characters]"


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def model_name(model: str) -> str:
    """The model as Langfuse shows it: a hub id as it is, a local directory by its name (never the
    machine's path); a hub cache snapshot (.../models--org--name/snapshots/<rev>) by its hub id."""
    p = Path(model).expanduser()
    if not (p.is_absolute() or model.startswith((".", "~")) or p.exists()):
        return model  # "org/name", "demo"
    p = p.resolve()
    if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
        return p.parent.parent.name.removeprefix("models--").replace("--", "/")
    return p.name or model


# ---------------------------------------------------------------------------------------------
# The sink


class TraceSink:
    """A StepSink. `plan()` names a step's traces (the trainer puts them on the record before any
    sink runs); `on_step()` hands the step to a worker thread that builds exactly those spans and
    scores and sends them, one step at a time."""

    def __init__(self, cfg: TracesSettings, creds: Credentials, span_exporter=None):
        """`span_exporter` replaces the OTLP exporter to Langfuse (tests: an in-memory one)."""
        self.cfg, self.creds = cfg, creds
        self.links = links(cfg.project_id, creds.base_url)
        said: set[str] = set()  # states already logged, across both signals: wrong keys make one error
        self._exporter = CountingSpanExporter(creds, Link(creds.base_url, "spans", said), cfg.flush_timeout_s, span_exporter)
        self._scores = ScorePoster(creds, Link(creds.base_url, "scores", said), cfg.flush_timeout_s)
        self._spans = Observations(creds, os.environ.get("LANGFUSE_TRACING_ENVIRONMENT") or "default")
        # Bounded: a worker that falls behind (a slow Langfuse) drops whole steps, counted, never blocks a step.
        self._queue: queue.Queue[StepStats | object | None] = queue.Queue(maxsize=64)
        self._handed = 0  # spans handed to the worker; at close, those neither delivered nor failed are lost
        self._worker = threading.Thread(target=self._drain, name="grpo-traces", daemon=True)
        patterns = [re.compile(p) for p in cfg.mask]
        self._mask = (lambda data: _redact(data, patterns)) if patterns else (lambda data: data)
        self.info: RunInfo | None = None

    # -- StepSink ------------------------------------------------------------------------------

    def start(self, info: RunInfo) -> None:
        self.info, self._model = info, model_name(info.model)
        grafana = (self.cfg.dashboard_url or os.environ.get("GRPO_SENTINEL_GRAFANA_URL") or "").rstrip("/")
        self._dashboard = f"{grafana}/d/grpo-health?var-run={urllib.parse.quote(info.run_id)}" if grafana else ""
        session = self.links.session(info.run_id)
        log.info("Langfuse traces to %s, session %s%s", self.creds.base_url, info.run_id, f" ({session})" if session else "")
        self._worker.start()

    def plan(self, s: StepStats) -> tuple[TraceRef, ...]:
        return plan(s, self.cfg, self.info.run_id, self.info.attempt)

    def on_step(self, s: StepStats) -> None:
        if not s.traces:
            return
        for c in s.health_new:
            ref = next((t for t in s.traces if t.kind == "train" and t.reason != "sampled"), None)
            if ref is not None:
                log.info("health: generations behind %s at step %d: %s", c, s.step,
                         self.links.trace(ref.trace_id) or f"trace {ref.trace_id}")
        try:
            self._queue.put_nowait(s)
            self._handed += _spans(s)
        except queue.Full:
            DROPS.add(DROPPED, _spans(s), signal="spans", reason="queue_full")

    def flush(self) -> None:
        """Wait (bounded) until the steps handed over so far are built and sent."""
        deadline = time.monotonic() + self.cfg.flush_timeout_s
        with contextlib.suppress(queue.Full):  # full: the worker sends a full batch before it gets there anyway
            self._queue.put_nowait(SEND)
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        if self.info is None:
            return
        deadline = time.monotonic() + self.cfg.flush_timeout_s
        with contextlib.suppress(queue.Full):  # a full queue: the worker is stuck, the join below times out
            self._queue.put(None, timeout=self.cfg.flush_timeout_s)
        self._worker.join(timeout=max(0.0, deadline - time.monotonic()))
        lost = self._handed - self._exporter.delivered - self._exporter.failed
        if lost > 0:  # still queued or in flight after the bounded wait: the process is about to end
            DROPS.add(DROPPED, lost, signal="spans", reason="shutdown")
        if DROPS.total(DROPPED):
            log.warning("Langfuse: %d trace spans and scores were not delivered (grpo_traces_dropped_total)",
                        DROPS.total(DROPPED))
        self.info = None

    # -- the worker ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Builds each step's spans and scores as it arrives, and sends what is built once a request's worth
        of spans is, SEND_AFTER_S after the oldest of them was built, at a flush and at the end: a few full
        requests instead of two per traced step (~1 ms of the client's CPU each)."""
        spans: list = []
        scores: list[dict] = []
        oldest = 0.0  # when the oldest unsent span was built
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, oldest + SEND_AFTER_S - time.monotonic()) if spans else None)
            except queue.Empty:  # the oldest has waited long enough
                self._send(spans, scores)
                continue
            try:
                if isinstance(item, StepStats):
                    oldest = oldest if spans else time.monotonic()
                    built = len(spans), len(scores)
                    try:
                        for ref in item.traces:
                            (self._train if ref.kind == "train" else self._eval)(item, ref, spans, scores)
                    except Exception:  # noqa: BLE001 - traces never stop training
                        log.exception("building the traces of step %d failed; training continues", item.step)
                        del spans[built[0]:], scores[built[1]:]  # that step's alone: the batch's others still go
                if item is SEND or item is None or len(spans) >= SPANS_PER_REQUEST:
                    self._send(spans, scores)
            finally:
                self._queue.task_done()
            if item is None:
                return

    def _send(self, spans: list, scores: list[dict]) -> None:
        """Spans, then the scores on them (each request bounded by the flush timeout); both lists emptied."""
        try:
            for i in range(0, len(spans), SPANS_PER_REQUEST):
                self._exporter.export(spans[i:i + SPANS_PER_REQUEST])
            self._scores.post(scores)
        except Exception:  # noqa: BLE001 - traces never stop training
            log.exception("sending traces failed; training continues")
        finally:
            spans.clear()
            scores.clear()

    def _trace(self, s: StepStats, ref: TraceRef, trace_name: str) -> dict:
        """What every span of the trace carries (the SDK's propagated attributes): session, name, tags."""
        return {"session.id": self.info.run_id, "langfuse.trace.name": trace_name,
                "langfuse.trace.tags": (ref.kind, *s.health)}

    def _root(self, s: StepStats, ref: TraceRef, name: str, trace: dict, prompt: str, output, meta: dict,
              root_id: int, start_ns: int):
        """The trace's root: a span with no parent under the planned trace id, whose own metadata is the
        trace-level metadata (the server keeps it as the trace's: v4 from the parentless span)."""
        meta = {"run_id": self.info.run_id, "attempt": self.info.attempt, "step": s.step, "kind": ref.kind,
                **({"dashboard": self._dashboard} if self._dashboard else {}), **meta}
        return self._spans.span(name, int(ref.trace_id, 16), root_id, None, trace, "span", self._mask(prompt),
                                output, self._mask(meta), start_ns)

    def _train(self, s: StepStats, ref: TraceRef, spans: list, scores: list[dict]) -> None:
        x, g = s.samples, ref.index
        G = len(x.completions) // len(x.prompts)
        prompt = clip(x.prompts[g], self.cfg.max_chars)
        judged = "correct" not in x.unmeasured  # a trainer without a verifier (TRL, no correctness reward)
        tid, root, start = int(ref.trace_id, 16), new_span_id(), time.time_ns()
        trace = self._trace(s, ref, f"train step {s.step} group {g}")
        for k, i in enumerate(range(g * G, (g + 1) * G)):
            gen = self._spans.span(
                f"completion {k}", tid, new_span_id(), root, trace, "generation", self._mask(prompt),
                self._mask(clip(x.completions[i], self.cfg.max_chars)),
                self._mask({"step": s.step, "kind": "train", "answer": x.answers[g],
                            "correct": bool(x.correct[i]) if judged else None, "reward": _num(x.reward[i]),
                            "rewards": {n: _num(v[i]) for n, v in x.components.items()},
                            "advantage": _num(x.advantage[i]),
                            "length": int(x.length[i]) if np.isfinite(x.length[i]) else None,
                            "entropy": _num(x.entropy[i]), "kl": _num(x.kl[i]), "truncated": bool(x.truncated[i])}),
                time.time_ns(), model=self._model, model_parameters=self.info.sampling, usage_details=_usage(x, g, i))
            spans.append(gen)
            gid = f"{gen.context.span_id:016x}"
            if math.isfinite(x.reward[i]):
                scores.append(self._score(ref.trace_id, gid, "reward", float(x.reward[i]), "NUMERIC"))
            if judged:
                scores.append(self._score(ref.trace_id, gid, "correct", float(x.correct[i]), "BOOLEAN"))
        output = {"rewards": [_num(r) for r in x.reward[g * G:(g + 1) * G]],
                  "correct": int(x.correct[g * G:(g + 1) * G].sum()) if judged else None}
        spans.append(self._root(s, ref, f"group {g}", trace, prompt, output,
                                {"group": g, "reason": ref.reason, "answer": x.answers[g],
                                 "group_reward_std": _num(x.group_reward_std[g])}, root, start))

    def _eval(self, s: StepStats, ref: TraceRef, spans: list, scores: list[dict]) -> None:
        ev, i = s.eval, ref.index
        prompt = clip(ev.prompts[i], self.cfg.max_chars)
        tid, root, start = int(ref.trace_id, 16), new_span_id(), time.time_ns()
        trace = self._trace(s, ref, f"eval step {s.step} prompt {i}")
        output = {}
        for mode, gens in ev.generations.items():
            params = self.info.sampling if mode == "sampled" else {"greedy": True, "max_new_tokens":
                                                                   self.info.sampling.get("max_new_tokens")}
            completion = self._mask(clip(gens.completions[i], self.cfg.max_chars))
            gen = self._spans.span(
                mode, tid, new_span_id(), root, trace, "generation", self._mask(prompt), completion,
                self._mask({"step": s.step, "kind": "eval", "mode": mode, "answer": ev.answers[i],
                            "correct": bool(gens.correct[i]), "length": int(gens.tokens[i])}),
                time.time_ns(), model=self._model, model_parameters=params,
                usage_details={"input": int(ev.prompt_tokens[i]), "output": int(gens.tokens[i])})
            spans.append(gen)
            scores.append(self._score(ref.trace_id, f"{gen.context.span_id:016x}", "correct", float(gens.correct[i]),
                                      "BOOLEAN"))
            output[mode] = {"completion": completion, "correct": bool(gens.correct[i])}
        spans.append(self._root(s, ref, f"held-out prompt {i}", trace, prompt, output,
                                {"prompt": i, "answer": ev.answers[i]}, root, start))

    def _score(self, tid: str, observation_id: str, name: str, value: float, data_type: str) -> dict:
        """A score-create body (the server's ScoreBody): on the generation, in the spans' environment.
        A deterministic id: a batch sent twice (a retry after a lost answer) upserts, never duplicates."""
        sid = hashlib.sha256(f"{tid}/{observation_id}/{name}".encode()).hexdigest()[:32]
        return {"id": sid, "traceId": tid, "observationId": observation_id, "name": name, "value": value,
                "dataType": data_type, "environment": self._spans.environment}


def _usage(x, g: int, i: int) -> dict[str, int]:
    """Token usage of completion i of group g: what the producer measured (TRL gives no prompt tokens)."""
    usage = {"input": x.prompt_tokens[g] if "prompt_tokens" not in x.unmeasured else math.nan, "output": x.length[i]}
    return {k: int(v) for k, v in usage.items() if math.isfinite(v)}


def _spans(s: StepStats) -> int:
    """Spans a step's traces make: a root per trace and a generation per completion (or mode)."""
    n = 0
    for t in s.traces:
        if t.kind == "train":
            n += 1 + len(s.samples.completions) // len(s.samples.prompts)
        else:
            n += 1 + len(s.eval.generations)
    return n
