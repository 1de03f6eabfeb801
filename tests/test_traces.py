"""Langfuse traces: what is traced (pure), what the sink builds (in-memory exporter; the spans the real
SDK builds), and what a real training run sends over the wire to a server implementing Langfuse's
ingestion contract (tests/langfuse_server.py): OTLP/HTTP protobuf spans and the scores API, with Basic auth."""

import base64
import csv
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import replace

import numpy as np
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from grpo_sentinel.telemetry.schema import Eval, Generations, RunInfo, Samples, Scales, StepStats
from grpo_sentinel.telemetry.settings import TracesSettings
from grpo_sentinel.telemetry.traces import Credentials, TraceSink, model_name, plan, trace_id
from helpers import cli, free_port, wait_for
from langfuse_server import FakeLangfuse

P, G = 8, 4


def step(n: int, health: tuple[str, ...] = (), rewards: np.ndarray | None = None, ev: Eval | None = None) -> StepStats:
    """A step of 8 groups x 4: group g's rewards are g/8 for all but group 5, which is [1, 1, 0, 0]."""
    r = np.repeat(np.arange(P) / P, G) if rewards is None else rewards
    r[20:24] = [1, 1, 0, 0]
    std = r.reshape(P, G).std(1, ddof=1)
    x = Samples(reward=r, components={"correct": (r > 0.5).astype(float)}, advantage=np.zeros(P * G),
                correct=r > 0.5, length=np.arange(P * G, dtype=float) % 7 + 1, truncated=np.zeros(P * G, bool),
                kl=np.full(P * G, 0.01), entropy=np.full(P * G, 0.5), group_reward_std=std,
                prompts=tuple(f"{g}+{g}=" for g in range(P)), answers=tuple(str(2 * g) for g in range(P)),
                completions=tuple(f"completion {i} of step {n}" for i in range(P * G)), prompt_tokens=np.full(P, 4.0))
    return replace(StepStats.partial(n, eval=ev), samples=x, health=health, health_new=health)


def test_plan_samples_a_fraction_every_few_steps_and_always_the_groups_that_explain_a_condition():
    cfg = TracesSettings(train_every=5, train_fraction=0.25)
    assert plan(step(3), cfg, "run", 1) == ()  # not a traced step, nothing active
    sampled = plan(step(5), cfg, "run", 1)
    assert len(sampled) == 2 and {t.reason for t in sampled} == {"sampled"}  # a quarter of 8 groups
    assert [t.trace_id for t in sampled] == [trace_id("run", 1, "train", 5, t.index) for t in sampled]
    # A condition at a step that is not a traced step: its explaining groups, first, whatever the rate.
    mixed = np.repeat(np.arange(P) / P, G)
    mixed[:4], mixed[28:] = [0, 0, 0, 0.5], [1, 1, 1, 0.5]  # the lowest and highest groups carry signal
    explained = plan(step(7, ("signal_vanished",), mixed), TracesSettings(sample_rate=0.01), "run", 1)
    reasons = {t.index: t.reason.split(" (")[0] for t in explained}
    assert reasons == {7: "highest reward", 0: "lowest reward", 1: "all-same rewards"}  # group 1: the first all-same
    assert [t.index for t in explained] == [0, 1, 7] and all(t.reason.endswith("(signal_vanished)") for t in explained)
    # An all-same group already among the explaining ones is not added twice.
    assert len(plan(step(7, ("signal_vanished",)), cfg, "run", 1)) == 2
    longest = plan(step(7, ("length_pathology",)), cfg, "run", 1)
    assert "longest completion" in {t.reason.split(" (")[0] for t in longest}
    # Deterministic, and a resumed run (the next attempt) never reuses an id.
    assert plan(step(5), cfg, "run", 1) == sampled
    assert not {t.trace_id for t in plan(step(5), cfg, "run", 2)} & {t.trace_id for t in sampled}


def heldout(n: int = 6) -> Eval:
    gens = {m: Generations(tuple(f"{m} {i}" for i in range(n)), np.arange(n) % 2 == 0, np.full(n, 3.0))
            for m in ("sampled", "greedy")}
    return Eval(sample_acc=0.5, greedy_acc=0.5, n=n, prompts=tuple(f"q{i}" for i in range(n)),
                answers=tuple(str(i) for i in range(n)), prompt_tokens=np.full(n, 2.0), generations=gens)


def test_a_held_out_round_traces_the_same_first_prompts_every_round_and_the_sample_rate_thins_them():
    refs = plan(StepStats.partial(20, eval=heldout(400)), TracesSettings(), "run", 1)
    assert [t.index for t in refs] == list(range(32)) and {t.kind for t in refs} == {"eval"}  # the default 32
    later = plan(StepStats.partial(40, eval=heldout(400)), TracesSettings(), "run", 1)
    assert [t.index for t in later] == list(range(32)) and not {t.trace_id for t in later} & {t.trace_id for t in refs}
    every = plan(StepStats.partial(20, eval=heldout(400)), TracesSettings(eval_prompts=400), "run", 1)
    assert [t.index for t in every] == list(range(400))
    assert len(plan(StepStats.partial(20, eval=heldout(6)), TracesSettings(), "run", 1)) == 6  # a smaller set: all
    thinned = plan(StepStats.partial(20, eval=heldout(400)), TracesSettings(eval_prompts=400, sample_rate=0.25), "run", 1)
    assert 60 < len(thinned) < 140  # ~100 of 400, chosen by trace id


@pytest.fixture
def langfuse():
    server = FakeLangfuse()
    yield server
    server.close()


INFO = RunInfo("run-7", "demo", "grpo", Scales(1.0, float(np.log(15)), 6), attempt=2,
               sampling={"temperature": 0.9, "top_p": 1.0, "max_new_tokens": 6})


def test_the_sink_builds_parentless_roots_generations_texts_scores_and_truncation(langfuse, monkeypatch):
    monkeypatch.setenv("LANGFUSE_TRACING_ENVIRONMENT", "staging")  # read when the sink is made
    memory = InMemorySpanExporter()
    grafana = "http://grafana.monitoring.svc.cluster.local:3000/" + "g" * 200  # no 200-character cap on metadata
    cfg = TracesSettings(max_chars=12, project_id="p1", dashboard_url=grafana)
    sink = TraceSink(cfg, Credentials("pk-lf-test", "sk-lf-test", langfuse.url), span_exporter=memory)
    sink.start(replace(INFO, model=str(demo_like_dir())))
    s = step(10, ("signal_vanished",))
    s = replace(s, traces=sink.plan(s))
    sink.on_step(s)
    sink.close()
    spans = memory.get_finished_spans()
    by_trace: dict[str, list] = {}
    for sp in spans:
        by_trace.setdefault(f"{sp.context.trace_id:032x}", []).append(sp)
    assert set(by_trace) == {t.trace_id for t in s.traces}  # exactly the planned traces, under their ids
    first = next(t for t in s.traces if t.index == 7)  # the highest-reward group: rewards 7/8
    trace = by_trace[first.trace_id]
    gens = [sp for sp in trace if sp.attributes["langfuse.observation.type"] == "generation"]
    root = [sp for sp in trace if sp.attributes["langfuse.observation.type"] == "span"]
    # The root has no parent (the server reads the trace's input, output, metadata from it); G children.
    assert len(gens) == G and len(root) == 1 and root[0].parent is None
    assert all(g.parent.span_id == root[0].context.span_id for g in gens)
    r = root[0].attributes
    assert r["langfuse.observation.input"] == "7+7="
    assert json.loads(r["langfuse.observation.output"]) == {"rewards": [0.875] * G, "correct": G}
    # The trace-level metadata is the root's own, typed; nothing is propagated to the generations.
    meta = {k.rsplit(".", 1)[1]: json.loads(v) for k, v in r.items() if k.startswith("langfuse.observation.metadata.")}
    assert meta == {"run_id": "run-7", "attempt": 2, "step": 10, "kind": "train", "group": 7, "answer": "14",
                    "reason": "highest reward (signal_vanished)", "group_reward_std": 0.0,
                    "dashboard": f"{grafana}/d/grpo-health?var-run=run-7"}
    assert not any(k.startswith("langfuse.trace.metadata") for sp in spans for k in sp.attributes)
    a = gens[0].attributes
    assert a["session.id"] == "run-7" and a["langfuse.trace.tags"] == ("train", "signal_vanished")
    assert a["langfuse.trace.name"] == "train step 10 group 7" and a["langfuse.environment"] == "staging"
    assert a["langfuse.observation.input"] == "7+7="
    assert a["langfuse.observation.output"] == "completion 2[... 12 more characters]"  # "completion 28 of step 10"
    assert a["langfuse.observation.model.name"] == "tiny-llama"  # the directory's name, not the machine's path
    assert json.loads(a["langfuse.observation.model.parameters"]) == {"temperature": 0.9, "top_p": 1.0, "max_new_tokens": 6}
    assert json.loads(a["langfuse.observation.usage_details"]) == {"input": 4, "output": int(s.samples.length[28])}
    assert json.loads(a["langfuse.observation.metadata.reward"]) == 0.875
    assert json.loads(a["langfuse.observation.metadata.rewards"]) == {"correct": 1.0}
    assert json.loads(a["langfuse.observation.metadata.step"]) == 10  # an int: no trace metadata over it
    # Scores went to the ingestion API, all accepted: reward (numeric) and correct (boolean) per generation,
    # in the spans' environment.
    assert not langfuse.refused
    ids = {f"{g.context.span_id:016x}" for sp in by_trace.values() for g in sp
           if g.attributes["langfuse.observation.type"] == "generation"}
    scores = list(langfuse.scores.values())
    assert {sc["observationId"] for sc in scores} == ids and len(scores) == 2 * len(ids)
    assert {(sc["name"], sc["dataType"]) for sc in scores} == {("reward", "NUMERIC"), ("correct", "BOOLEAN")}
    assert {sc["environment"] for sc in scores} == {"staging"}
    posted = [q for q in langfuse.requests if q["path"] == "/api/public/ingestion"]
    assert posted and all(q["headers"]["x-langfuse-sdk-name"] == "python" for q in posted)


def demo_like_dir():
    """A local model directory: Langfuse shows its name, never where it lies on this machine."""
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp()) / "tiny-llama"
    d.mkdir()
    return d


def test_spans_and_scores_go_in_batches_at_a_flush_after_a_while_and_at_the_end(langfuse, monkeypatch):
    """A request per batch, not two per traced step: what is built waits for a flush, SEND_AFTER_S, or the end."""
    from grpo_sentinel.telemetry import traces

    requests: list[int] = []  # spans per span export

    class Counting(InMemorySpanExporter):
        def export(self, spans):
            requests.append(len(spans))
            return super().export(spans)

    def scores_posts() -> int:
        return sum(q["path"] == "/api/public/ingestion" for q in langfuse.requests)

    sink = TraceSink(TracesSettings(train_every=1), Credentials("pk-lf-test", "sk-lf-test", langfuse.url),
                     span_exporter=Counting())
    sink.start(INFO)
    for n in (1, 2, 3):  # one group of 8 a step (train_fraction 1/8): a root and G generations
        s = step(n)
        sink.on_step(replace(s, traces=sink.plan(s)))
    sink.flush()
    assert requests == [3 * (1 + G)] and scores_posts() == 1
    monkeypatch.setattr(traces, "SEND_AFTER_S", 0.05)
    s = step(4)
    sink.on_step(replace(s, traces=sink.plan(s)))
    assert wait_for(lambda: requests == [3 * (1 + G), 1 + G] and scores_posts() == 2, timeout=10)  # no flush
    sink.close()
    assert requests == [3 * (1 + G), 1 + G] and scores_posts() == 2  # nothing was left for the end
    assert len(langfuse.scores) == 4 * 2 * G  # a reward and a verdict per generation


def test_a_step_whose_traces_cannot_be_built_loses_only_its_own(langfuse, caplog):
    memory = InMemorySpanExporter()
    sink = TraceSink(TracesSettings(train_every=1), Credentials("pk-lf-test", "sk-lf-test", langfuse.url),
                     span_exporter=memory)
    sink.start(INFO)
    good, later = step(1), step(3)
    # A producer's bug: no greedy verdicts (the worker meets it after the first prompt's sampled generation).
    ev = heldout(6)
    ev = replace(ev, generations={**ev.generations, "greedy": replace(ev.generations["greedy"], correct=np.array([]))})
    broken = StepStats.partial(2, eval=ev)
    planned = [replace(s, traces=sink.plan(s)) for s in (good, broken, later)]
    for s in planned:
        sink.on_step(s)
    sink.close()
    sent = {f"{sp.context.trace_id:032x}" for sp in memory.get_finished_spans()}
    assert sent == {t.trace_id for s in (planned[0], planned[2]) for t in s.traces}  # the batch's others, and after
    assert "building the traces of step 2 failed" in caplog.text


def test_a_model_is_named_by_its_hub_id_or_its_directory_never_a_path(tmp_path):
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen2-0.5B" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert model_name("Qwen/Qwen2-0.5B") == "Qwen/Qwen2-0.5B" and model_name("demo") == "demo"
    assert model_name(str(tmp_path / "hub")) == "hub" and model_name(str(tmp_path / "hub") + "/") == "hub"
    assert model_name(str(snapshot)) == "Qwen/Qwen2-0.5B"
    assert model_name("/models/not-here") == "not-here"  # absolute: a path even where it is not mounted


def test_the_mask_redacts_before_anything_leaves_the_process_each_sink_its_own(langfuse):
    memory = InMemorySpanExporter()

    def masked(mask: list[str]) -> list:
        # One public key, two sinks: each masks with its own patterns.
        sink = TraceSink(TracesSettings(mask=mask), Credentials("pk-lf-mask", "sk-lf-test", langfuse.url), span_exporter=memory)
        sink.start(INFO)
        s = step(5)
        sink.on_step(replace(s, traces=sink.plan(s)))
        sink.close()
        spans = memory.get_finished_spans()
        memory.clear()
        return spans

    langfuse.auth = "Basic " + base64.b64encode(b"pk-lf-mask:sk-lf-test").decode()
    spans = masked([r"completion \d+", r"\d\+\d"])
    gens = [sp for sp in spans if sp.attributes["langfuse.observation.type"] == "generation"]
    assert gens and all(g.attributes["langfuse.observation.output"].startswith("[REDACTED] of step") for g in gens)
    assert {sp.attributes["langfuse.observation.input"] for sp in spans} == {"[REDACTED]="}
    unmasked = masked([])  # the second sink in this process: not the first one's mask
    inputs = {sp.attributes["langfuse.observation.input"] for sp in unmasked}
    assert inputs and inputs <= {f"{g}+{g}=" for g in range(P)}


def test_the_stand_in_refuses_what_the_server_refuses(langfuse):
    """The requests a sink really sends pass; each mutation the server's schemas refuse is refused."""
    import copy
    import gzip

    import requests

    langfuse.auth = "Basic " + base64.b64encode(b"pk-lf-strict:sk-lf-test").decode()
    sink = TraceSink(
        TracesSettings(), Credentials("pk-lf-strict", "sk-lf-test", langfuse.url), span_exporter=InMemorySpanExporter()
    )
    sink.start(INFO)
    s = step(5)
    sink.on_step(replace(s, traces=sink.plan(s)))
    sink.close()
    sent = next(q for q in langfuse.requests if q["path"] == "/api/public/ingestion")
    assert sent["status"] == 207 and not langfuse.refused and langfuse.scores
    batch = json.loads(sent["body"])
    headers = {"Authorization": langfuse.auth, "Content-Type": "application/json"}

    def ingest(mutate) -> list[dict]:
        body = copy.deepcopy(batch)
        mutate(body["batch"][0])
        r = requests.post(langfuse.url + "/api/public/ingestion", data=json.dumps(body), headers=headers, timeout=5)
        assert r.status_code == 207
        return r.json()["errors"]

    assert ingest(lambda e: None) == []  # as sent: valid
    mutations = {
        "event id missing": lambda e: e.pop("id"),
        "timestamp without an offset": lambda e: e.update(timestamp="2026-12-01T10:00:00"),
        "not a score event": lambda e: e.update(type="trace-create"),
        "no trace id for an observation score": lambda e: e["body"].pop("traceId"),
        "trace and session": lambda e: e["body"].update(sessionId="s"),
        "numeric value as a string": lambda e: e["body"].update(value="0.5", dataType="NUMERIC"),
        "boolean 0.5": lambda e: e["body"].update(value=0.5, dataType="BOOLEAN"),
        "boolean true (JSON has booleans; the schema wants 0 or 1)": lambda e: e["body"].update(value=True, dataType="BOOLEAN"),
        "unknown data type": lambda e: e["body"].update(dataType="NUMBER"),
        "empty name": lambda e: e["body"].update(name=""),
        "score id not a string": lambda e: e["body"].update(id=7),
        "observation id not a string": lambda e: e["body"].update(observationId=123),
    }
    for what, mutate in mutations.items():
        errors = ingest(mutate)
        assert [e["status"] for e in errors] == [400], what
    # A batch that is not {"batch": [...]}, a body that is not JSON (NaN), or not said to be JSON: 400.
    for data, ctype in ((json.dumps(batch["batch"]), "application/json"),
                        ('{"batch": [{"value": NaN}]}', "application/json"), (json.dumps(batch), "text/plain")):
        r = requests.post(
            langfuse.url + "/api/public/ingestion", data=data, headers={**headers, "Content-Type": ctype}, timeout=5
        )
        assert r.status_code == 400, (data[:40], ctype)
    # The scores route takes one score object: the list SDK 5.2's client sends is a 400.
    scores = [e["body"] for e in batch["batch"]]
    r = requests.post(langfuse.url + "/api/public/scores", json=scores, headers=headers, timeout=5)
    assert r.status_code == 400
    r = requests.post(langfuse.url + "/api/public/scores", json=scores[0], headers=headers, timeout=5)
    assert r.status_code == 200 and r.json() == {"id": scores[0]["id"]}
    # OTLP: the content type, the ingestion version, the ids' lengths.
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    req = ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add(name="s", trace_id=bytes(16), span_id=bytes(8))
    otlp = langfuse.url + "/api/public/otel/v1/traces"
    proto = {"Authorization": langfuse.auth, "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}

    def export(headers=proto) -> int:
        return requests.post(otlp, data=gzip.compress(req.SerializeToString()), headers=headers, timeout=5).status_code

    assert export() == 200 and export({**proto, "x-langfuse-ingestion-version": "4"}) == 200
    assert export({**proto, "x-langfuse-ingestion-version": "5"}) == 400
    assert export({**proto, "Content-Type": "application/octet-stream"}) == 400
    assert export({**proto, "Content-Encoding": "identity"}) == 400  # gzip bytes the server does not gunzip
    span.span_id = b"\x01\x02\x03\x04"
    assert export() == 400
    span.span_id, span.trace_id = bytes(8), b""
    assert export() == 400
    # On demand: 403, 429, 503.
    for status in (403, 429, 503):
        langfuse.fail("otel", status, times=1)
        span.trace_id = bytes(16)
        assert export() == status and export() == 200


# ---------------------------------------------------------------------------------------------
# A real training run over the wire

def test_two_sinks_for_one_key_in_one_process_each_send_to_their_own_host():
    """No SDK client per public key (the SDK binds a key to the first host it was used with): each sink
    sends to the host it was given, with its own backoff."""
    servers = [FakeLangfuse("pk-lf-hosts", "sk"), FakeLangfuse("pk-lf-hosts", "sk")]
    try:
        for n, server in enumerate(servers):
            sink = TraceSink(TracesSettings(), Credentials("pk-lf-hosts", "sk", server.url))
            sink.start(replace(INFO, run_id=f"run-{n}"))
            s = step(5)
            sink.on_step(replace(s, traces=sink.plan(s)))
            sink.close()
        assert [{t.session_id for t in server.traces().values()} for server in servers] == [{"run-0"}, {"run-1"}]
    finally:
        for server in servers:
            server.close()


def test_the_spans_are_the_ones_the_langfuse_sdk_builds():
    """Observations writes the SDK 5's attributes without its per-span machinery: the same trace built
    through the real SDK (its client, propagate_attributes, start_observation) has the same attributes,
    names, parents and instrumentation scope."""
    from langfuse import Langfuse, propagate_attributes
    from opentelemetry.sdk.trace import TracerProvider

    from grpo_sentinel.telemetry.langfuse_wire import Observations, new_span_id

    memory = InMemorySpanExporter()
    creds = Credentials("pk-lf-same", "sk-lf-test", "http://127.0.0.1:9")
    lf = Langfuse(public_key=creds.public_key, secret_key=creds.secret_key, base_url=creds.base_url,
                  tracer_provider=TracerProvider(), span_exporter=memory, environment="staging")
    meta = {"step": 3, "answer": "14", "correct": None, "rewards": {"correct": 1.0}, "note": "é"}
    gen = {"model": "demo", "model_parameters": {"temperature": 0.9}, "usage_details": {"input": 4, "output": 2}}
    with propagate_attributes(session_id="run-7", trace_name="train step 3 group 1", tags=["train", "kl_runaway"]):
        root = lf.start_observation(name="group 1", as_type="span", input="1+1=", metadata=meta)
        root.start_observation(name="completion 0", as_type="generation", input="1+1=", output="2", metadata=meta,
                               **gen).end()
        root.update(output={"rewards": [1.0, None]})
        root.end()
    lf.shutdown()
    sdk = {sp.name: sp for sp in memory.get_finished_spans()}
    obs = Observations(creds, "staging")
    trace = {"session.id": "run-7", "langfuse.trace.name": "train step 3 group 1", "langfuse.trace.tags": ("train", "kl_runaway")}
    tid, rid = sdk["group 1"].context.trace_id, new_span_id()
    ours = {"group 1": obs.span("group 1", tid, rid, None, trace, "span", "1+1=", {"rewards": [1.0, None]}, meta, 0),
            "completion 0": obs.span("completion 0", tid, new_span_id(), rid, trace, "generation", "1+1=", "2", meta, 0,
                                     **gen)}
    for name, theirs in sdk.items():
        assert dict(ours[name].attributes) == dict(theirs.attributes), name
        assert (ours[name].parent is None) == (theirs.parent is None) and ours[name].kind == theirs.kind
        assert ours[name].instrumentation_scope == theirs.instrumentation_scope
    assert set(sdk) == set(ours)


KEYS = {"LANGFUSE_PUBLIC_KEY": "pk-lf-test", "LANGFUSE_SECRET_KEY": "sk-lf-test"}
ARGS = ["--steps", "10", "--set", "run.sample_every=5", "--set", "data.eval_size=12", "--set", "telemetry.prometheus=false",
        "--set", "traces.project_id=proj", "--set", "run.checkpoint_every=5"]


def train(tmp_path, url: str, *extra: str, keys=KEYS, run_id: str = "r", timeout: float = 300):
    env = {**os.environ, **keys, "LANGFUSE_BASE_URL": url}
    return subprocess.run(cli("train", "--out", str(tmp_path), "--set", f"run.run_id={run_id}", *ARGS, *extra),
                          capture_output=True, text=True, env=env, timeout=timeout)


def rows(path) -> list[dict]:
    return list(csv.DictReader(path.open()))


def delivered_as_planned(tmp_path, langfuse, run_id: str = "r") -> dict:
    """Every trace the record names arrived whole (a parentless root under its id, with the trace-level
    input, and its generations); returns the traces."""
    traces = langfuse.traces()
    record = rows(tmp_path / run_id / "steps.csv")
    named = {t for r in record for t in r["trace_ids"].split()}
    named |= {r["eval_trace_id"] for r in rows(tmp_path / run_id / "reward-vs-step.csv") if r["eval_trace_id"]}
    assert named and named <= set(traces), sorted(named - set(traces))[:5]
    for tid in named:
        t = traces[tid]
        assert t.root is not None and t.root["trace_id"] == tid, tid  # the root has no parent
        assert t.input and t.output is not None and t.metadata["run_id"] == run_id, (tid, t.input, t.output)
        assert t.session_id == run_id and t.generations
        assert all(g["metadata"]["step"] == t.metadata["step"] for g in t.generations)  # typed, not overridden
    return traces


def test_a_training_run_sends_every_held_out_round_and_sampled_groups_linked_from_the_record(tmp_path, langfuse, demo_dir):
    p = train(tmp_path, langfuse.url)
    assert p.returncode == 0, p.stderr[-3000:]
    traces = delivered_as_planned(tmp_path, langfuse)
    assert not langfuse.refused  # every request passed the server's contract
    names = {t.name for t in traces.values()}
    # Held-out rounds at steps 0, 5, 10: one trace per prompt; training groups every 5 steps (1 of 8).
    assert {f"eval step {s} prompt {i}" for s in (0, 5, 10) for i in range(12)} <= names
    assert {n.rsplit(" group", 1)[0] for n in names if n.startswith("train")} == {"train step 5", "train step 10"}
    held_out = [t for t in traces.values() if t.metadata["kind"] == "eval"]
    assert held_out and all(set(t.output) == {"sampled", "greedy"} for t in held_out)  # the trace-level output
    assert {g["model"] for t in traces.values() for g in t.generations} == {"demo"}
    # The record names them: steps.csv trace_ids, reward-vs-step.csv the round's first trace and its link.
    record = rows(tmp_path / "r" / "steps.csv")
    curve = rows(tmp_path / "r" / "reward-vs-step.csv")
    assert [r["step"] for r in curve] == ["0", "5", "10"]
    assert curve[1]["eval_trace_url"] == f"{langfuse.url}/project/proj/traces/{curve[1]['eval_trace_id']}"
    # diagnose reads them back: each step's first trace, for the conditions' links.
    from grpo_sentinel.telemetry.health.ingest import load

    assert load(tmp_path / "r").traces == {int(r["step"]): r["trace_ids"].split()[0] for r in record if r["trace_ids"]}
    # Every generation is scored; the scores point at the generations the server received, one per id.
    generations = {g["span_id"] for t in traces.values() for g in t.generations}
    assert {sc["observationId"] for sc in langfuse.scores.values()} == generations
    assert all(sc["traceId"] in traces for sc in langfuse.scores.values())
    # The exporter says who it is (the server attributes ingestion to it) and asks for the v4 write path.
    otlp = [q["headers"] for q in langfuse.requests if q["path"] == "/api/public/otel/v1/traces"]
    assert otlp and all(h["x-langfuse-sdk-name"] == "python" and h["x-langfuse-ingestion-version"] == "4" for h in otlp)
    # The keys never appear in the logs, the run directory or the payloads (only in the auth header).
    secret, public = KEYS["LANGFUSE_SECRET_KEY"], KEYS["LANGFUSE_PUBLIC_KEY"]
    everything = p.stdout + p.stderr + "".join(f.read_text(errors="replace") for f in (tmp_path / "r").rglob("*")
                                                 if f.is_file() and f.suffix in (".csv", ".json", ".yaml"))
    assert secret not in everything and public not in everything
    assert not any(secret.encode() in r["body"] or public.encode() in r["body"] for r in langfuse.requests)
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["telemetry_dropped"] == {}


@pytest.mark.slow
def test_a_server_refusing_every_score_still_gets_every_span_and_the_refusals_are_counted(tmp_path, langfuse, demo_dir):
    langfuse.fail("ingestion", 400)
    p = train(tmp_path, langfuse.url)
    assert p.returncode == 0, p.stderr[-3000:]
    traces = delivered_as_planned(tmp_path, langfuse)
    # Every span of every trace: a root and a generation per completion (the demo's group of 8) or held-out mode (2).
    assert all(len(t.spans) == 1 + (2 if t.metadata["kind"] == "eval" else 8) for t in traces.values())
    assert not langfuse.scores
    dropped = json.loads((tmp_path / "r" / "summary.json").read_text())["telemetry_dropped"]
    generations = sum(len(t.generations) for t in traces.values())
    train_gens = sum(len(t.generations) for t in traces.values() if t.metadata["kind"] == "train")
    # Each generation's scores: correct, and the reward of each training completion; none of the spans.
    assert dropped == {"grpo.traces.dropped{reason=rejected,signal=scores}": generations + train_gens}
    assert p.stderr.count("refused scores") == 1  # said once, then only counted


@pytest.mark.slow
def test_a_207_with_some_scores_refused_counts_exactly_those(tmp_path, langfuse, demo_dir):
    langfuse.event_status = lambda event: 500 if event["body"]["name"] == "reward" else None
    p = train(tmp_path, langfuse.url)
    assert p.returncode == 0, p.stderr[-3000:]
    traces = delivered_as_planned(tmp_path, langfuse)
    train_gens = {g["span_id"] for t in traces.values() if t.metadata["kind"] == "train" for g in t.generations}
    kept = list(langfuse.scores.values())
    assert kept and {sc["name"] for sc in kept} == {"correct"}  # the rest of each batch went in
    assert {sc["observationId"] for sc in kept} == {g["span_id"] for t in traces.values() for g in t.generations}
    dropped = json.loads((tmp_path / "r" / "summary.json").read_text())["telemetry_dropped"]
    assert dropped == {"grpo.traces.dropped{reason=rejected,signal=scores}": len(train_gens)}


@pytest.mark.slow
def test_wrong_keys_are_one_clear_error_counted_drops_and_a_completed_run(tmp_path, langfuse, demo_dir):
    p = train(tmp_path, langfuse.url, keys={**KEYS, "LANGFUSE_SECRET_KEY": "sk-lf-wrong"})
    assert p.returncode == 0, p.stderr[-3000:]
    assert langfuse.rejected > 0 and not langfuse.spans and not langfuse.scores and not langfuse.refused
    assert p.stderr.count("rejected the keys") == 1 and "Traceback" not in p.stderr
    dropped = json.loads((tmp_path / "r" / "summary.json").read_text())["telemetry_dropped"]
    assert dropped.get("grpo.traces.dropped{reason=unauthorized,signal=spans}", 0) > 0
    assert dropped.get("grpo.traces.dropped{reason=unauthorized,signal=scores}", 0) > 0
    assert "sk-lf-wrong" not in p.stderr + p.stdout


@pytest.mark.slow
def test_langfuse_down_for_the_whole_run_costs_nothing_but_counted_drops(tmp_path, demo_dir):
    p = train(tmp_path, f"http://127.0.0.1:{free_port()}")  # nothing listens there
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.count("trace export failing") == 1 and "Traceback" not in p.stderr
    dropped = json.loads((tmp_path / "r" / "summary.json").read_text())["telemetry_dropped"]
    assert dropped.get("grpo.traces.dropped{reason=unreachable,signal=spans}", 0) > 0


@pytest.mark.slow
def test_a_server_that_accepts_and_never_answers_cannot_hold_the_exit(tmp_path, demo_dir):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []
    stop = threading.Event()

    def accept():  # take every connection and say nothing
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    threading.Thread(target=accept, daemon=True).start()
    try:
        t0 = time.monotonic()
        p = train(tmp_path, f"http://127.0.0.1:{listener.getsockname()[1]}", "--set", "traces.flush_timeout_s=1")
        took = time.monotonic() - t0
    finally:
        stop.set()
        listener.close()
    assert p.returncode == 0, p.stderr[-3000:]
    assert held  # it did connect
    baseline = json.loads((tmp_path / "r" / "summary.json").read_text())["seconds_this_session"]
    # The loop's own time plus start-up (~10 s): the bounded flushes (1 s at each checkpoint and at the
    # end, export timeouts behind a backoff) add seconds, never the SDK's unbounded waits.
    assert took < baseline + 30, (took, baseline)


@pytest.mark.slow
def test_a_resumed_run_never_emits_a_trace_id_twice(tmp_path, langfuse, demo_dir):
    env = {**os.environ, **KEYS, "LANGFUSE_BASE_URL": langfuse.url}
    args = cli("train", "--out", str(tmp_path), "--set", "run.run_id=r", *ARGS, "--steps", "16",
               "--set", "traces.train_every=1")
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: (tmp_path / "r" / "checkpoints" / "step-00000005").is_dir() and
                    len(rows(tmp_path / "r" / "steps.csv")) >= 8 or proc.poll() is not None)
    proc.kill()
    proc.wait()
    first_attempt = set(langfuse.traces())
    r = subprocess.run(cli("train", "--resume", str(tmp_path / "r")), env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    roots = [sp["trace_id"] for sp in langfuse.spans if not sp["parent_id"]]
    assert len(roots) == len(set(roots))  # every trace id sent once, across both attempts
    assert {t.metadata["attempt"] for t in langfuse.traces().values()} == {1, 2} and first_attempt
    # The record lists only the second attempt's traces for the steps it re-did.
    record = rows(tmp_path / "r" / "steps.csv")
    assert [r["step"] for r in record] == [str(s) for s in range(1, 17)]
    resumed = {t for r in record if int(r["step"]) > 5 for t in r["trace_ids"].split()}
    assert resumed and not resumed & first_attempt


def test_diagnose_links_each_condition_to_the_generations_behind_it(monkeypatch):
    from grpo_sentinel.telemetry.health.detectors import Condition, Diagnosis
    from grpo_sentinel.telemetry.health.report import to_text, with_generations
    from grpo_sentinel.telemetry.health.runlog import RunLog
    from grpo_sentinel.telemetry.health.thresholds import Thresholds

    log = RunLog({"step": np.arange(1.0, 13)}, "r/steps.csv", "sentinel", traces={5: "ab" * 16, 9: "cd" * 16},
                 trace_project="p1")

    def linked() -> list[str]:
        diag = Diagnosis([Condition("signal_vanished", "warning", 4, 8, "e", "c", "a"),
                          Condition("kl_runaway", "critical", 10, 12, "e", "c", "a")])
        return [c.generations for c in with_generations(diag, log).conditions], to_text(diag, log, Thresholds(window=2))

    monkeypatch.setenv("LANGFUSE_BASE_URL", "https://langfuse.example.com/")
    (first, second), text = linked()
    assert first == "https://langfuse.example.com/project/p1/traces/" + "ab" * 16  # the first trace in steps 4-8
    assert second == "" and f"generations: {first}" in text  # nothing was traced in steps 10-12
    monkeypatch.delenv("LANGFUSE_BASE_URL")
    assert linked()[0][0] == f"trace {'ab' * 16} (step 5)"  # without a Langfuse URL: the id and the step
