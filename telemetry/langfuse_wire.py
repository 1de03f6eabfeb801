"""How the traces travel to Langfuse: spans as the Langfuse SDK writes them, the OTLP span exporter,
the score poster, and the backoff of each. What is traced and how a trace is built is
telemetry/traces.py; the server contract these follow (Langfuse v4.16 source) is enforced by
tests/langfuse_server.py.

- Spans: OTLP/HTTP protobuf, gzip, Basic auth, to `/api/public/otel/v1/traces`, with the SDK's
  name/version headers and `x-langfuse-ingestion-version: 4` (the server's direct v4 write path).
- Scores: `score-create` events to the ingestion API (`POST /api/public/ingestion`, `{"batch": [...]}`,
  answered 207 per event), which every server version accepts; the scores route takes one object.
- Each signal backs off on its own, and only while Langfuse is unreachable or rejects the keys; a
  refused batch or event is dropped and counted (`grpo_traces_dropped_total{signal, reason}`).
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

from grpo_sentinel.telemetry.drops import DROPS

log = logging.getLogger("grpo_sentinel.telemetry.traces")  # one logger for the Langfuse sink, wire included

DROPPED = "grpo.traces.dropped"
OTLP = "/api/public/otel/v1/traces"
INGESTION = "/api/public/ingestion"  # the batch API: score-create events, answered 207 per event
SCORES_PER_REQUEST = 500  # ~350 bytes each: far under the ingestion API's 4.5 MB body limit
SPANS_PER_REQUEST = 512  # ~1 kB each before gzip (the SDK's batch processor sends 512 at most too)


@dataclass(frozen=True)
class Credentials:
    public_key: str
    secret_key: str = field(repr=False)  # never printed, not even in a traceback's locals
    base_url: str


# ---------------------------------------------------------------------------------------------
# The connection to Langfuse: one link per signal (spans, scores), so one never pauses the other

PAUSING = ("unreachable", "unauthorized")  # the causes that skip a signal for a backoff; a refusal does not


class Link:
    """After an export fails because Langfuse is unreachable or rejects the keys, that signal's exports
    are skipped (and their items counted) for a backoff that doubles up to a minute: a dead server costs
    one timeout per backoff, not one per batch, and nothing piles up in memory. A refused batch or item
    (HTTP 400, a 207 error) is dropped and counted, and the next one goes out as usual. Each change of
    state is logged once, across the signals (`said` is shared: wrong keys make one error, not two)."""

    def __init__(self, base_url: str, signal: str, said: set[str]):
        self.base_url, self.signal, self._said = base_url, signal, said
        self._lock = threading.Lock()
        self.state = "ok"  # ok | unreachable | unauthorized | rejected
        self._retry_at = 0.0
        self._backoff = 0.0

    def open(self) -> bool:
        return time.monotonic() >= self._retry_at

    def succeeded(self) -> None:
        with self._lock:
            was, self.state, self._backoff, self._retry_at = self.state, "ok", 0.0, 0.0
        if was in PAUSING:
            self._said.discard(was)
            log.info("Langfuse at %s reachable again; %s flow", self.base_url, self.signal)

    def failed(self, reason: str, detail: str) -> None:
        with self._lock:
            if reason in PAUSING:
                self._backoff = min(60.0, max(2.0, 2 * self._backoff))
                self._retry_at = time.monotonic() + self._backoff
            if reason == self.state:
                return
            self.state = reason
            said = reason if reason in PAUSING else f"{reason}/{self.signal}"  # a refusal: once per signal, ever
            if said in self._said:
                return
            self._said.add(said)
        if reason == "unauthorized":
            log.error("Langfuse at %s rejected the keys (%s): check LANGFUSE_PUBLIC_KEY and LANGFUSE_SECRET_KEY. "
                      "Training continues; traces are dropped and counted in grpo_traces_dropped_total", self.base_url, detail)
        elif reason == "rejected":
            log.warning("Langfuse at %s refused %s (%s); they are dropped and counted in grpo_traces_dropped_total, "
                        "the rest still flows", self.base_url, self.signal, detail)
        else:
            log.warning("Langfuse at %s: trace export failing (%s, %s). Training continues; dropped traces are counted "
                        "in grpo_traces_dropped_total", self.base_url, reason, detail)


def reason_of(status: int | None) -> str:
    if status in (401, 403):
        return "unauthorized"
    if status is not None and 400 <= status < 500 and status != 429:
        return "rejected"
    return "unreachable"  # no answer, a timeout, 429 or a server error


def headers(creds: Credentials) -> dict[str, str]:
    """What the SDK's own exporter sends: Basic auth, and the SDK's name and version (the server
    attributes the ingestion to them, and they select its direct v4 write path)."""
    from importlib.metadata import version

    auth = base64.b64encode(f"{creds.public_key}:{creds.secret_key}".encode()).decode()
    return {"Authorization": f"Basic {auth}", "x-langfuse-sdk-name": "python", "x-langfuse-sdk-version": version("langfuse"),
            "x-langfuse-public-key": creds.public_key}


class CountingSpanExporter:
    """Exports a step's spans with delivery counted and the backoff of `Link`: by default as OTLP/HTTP
    protobuf (the OpenTelemetry encoder), gzip, to Langfuse's ingestion endpoint, or through `inner`, any
    SpanExporter (tests: an in-memory one). Called from the trace sink's worker thread, one request at a time."""

    def __init__(self, creds: Credentials, link: Link, timeout_s: float, inner=None):
        import requests

        self.link, self.inner, self.timeout_s = link, inner, timeout_s
        self.url = creds.base_url + OTLP
        self.session = requests.Session()
        # Langfuse's ingestion contract: OTLP/HTTP protobuf, gzip, Basic auth; version 4 writes events directly.
        self.session.headers.update({**headers(creds), "x-langfuse-ingestion-version": "4",
                                     "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        self.delivered = self.failed = 0  # spans

    def export(self, spans: Sequence) -> bool:
        n = len(spans)
        if not self.link.open():
            self.failed += n
            DROPS.add(DROPPED, n, signal="spans", reason=self.link.state)
            return False
        try:
            status, detail = self._send(spans)
        except Exception as e:  # noqa: BLE001 - no answer, or an exporter bug: never the sink's worker's end
            status, detail = None, type(e).__name__ if isinstance(e, OSError) else repr(e)
        if status is not None and 200 <= status < 300:
            self.delivered += n
            self.link.succeeded()
            return True
        reason = reason_of(status)
        self.failed += n
        DROPS.add(DROPPED, n, signal="spans", reason=reason)
        self.link.failed(reason, detail)
        return False

    def _send(self, spans: Sequence) -> tuple[int | None, str]:
        """(HTTP status, what to say of it); None: no answer."""
        if self.inner is not None:
            from opentelemetry.sdk.trace.export import SpanExportResult

            return (200, "") if self.inner.export(spans) is SpanExportResult.SUCCESS else (None, "no answer")
        r = self.session.post(
            self.url,
            data=gzip.compress(encode_spans(spans).SerializeToString(), compresslevel=6),
            timeout=self.timeout_s,
        )
        return r.status_code, f"HTTP {r.status_code}: {r.text[:200]}"


class ScorePoster:
    """Scores as `score-create` events to the ingestion API, from the sink's worker thread: one request
    per 500, the 207 answer read per event, so we know exactly what was delivered and why the rest was
    not. (The SDK's score client posts a JSON list to /api/public/scores, a body that route refuses up
    to at least server v4.16: it takes one score object.)"""

    def __init__(self, creds: Credentials, link: Link, timeout_s: float):
        import requests

        self.url, self.link, self.timeout_s = creds.base_url + INGESTION, link, timeout_s
        self.session = requests.Session()
        self.session.headers.update({**headers(creds), "Content-Type": "application/json"})

    def post(self, scores: list[dict]) -> None:
        """scores: score bodies (`TraceSink._score`), each sent as one event whose id is the score's id."""
        import requests

        for i in range(0, len(scores), SCORES_PER_REQUEST):
            batch = scores[i:i + SCORES_PER_REQUEST]
            if not self.link.open():
                DROPS.add(DROPPED, len(batch), signal="scores", reason=self.link.state)
                continue
            now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            body = json.dumps({"batch": [{"id": sc["id"], "timestamp": now, "type": "score-create", "body": sc}
                                         for sc in batch]}, allow_nan=False)
            try:
                r = self.session.post(self.url, data=body, timeout=self.timeout_s)
            except requests.RequestException as e:
                DROPS.add(DROPPED, len(batch), signal="scores", reason="unreachable")
                self.link.failed("unreachable", type(e).__name__)
                continue
            if r.status_code == 207:
                self._results(r, len(batch))
            elif r.ok:  # a server that answers the batch as a whole
                self.link.succeeded()
            else:
                reason = reason_of(r.status_code)
                DROPS.add(DROPPED, len(batch), signal="scores", reason=reason)
                self.link.failed(reason, f"HTTP {r.status_code}: {r.text[:200]}")

    def _results(self, r, n: int) -> None:
        """A 207: {"successes": [{id, status}], "errors": [{id, status, message, error}]}, per event;
        an event the answer names neither way counts as refused."""
        try:
            result = r.json()
            errors = list(result.get("errors") or [])
            delivered = min(n, len(result.get("successes") or []))
        except (ValueError, AttributeError, TypeError):
            errors, delivered = [{"message": "unreadable 207 answer"}], 0
        if delivered:
            self.link.succeeded()
        if delivered < n:  # refused one by one (whatever the status: the server answered): dropped, pausing nothing
            DROPS.add(DROPPED, n - delivered, signal="scores", reason="rejected")
            first = errors[0] if errors else {"message": "not named in the answer"}
            self.link.failed("rejected", f"{n - delivered} of {n} scores, first: HTTP {first.get('status')} "
                                         f"{first.get('message', '')}: {str(first.get('error', ''))[:200]}")


def new_span_id() -> int:
    return random.getrandbits(64) or 1  # the SDK's RandomIdGenerator: 64 random bits, never 0 (invalid)


class Observations:
    """Finished spans as the Langfuse SDK 5 writes them (`langfuse._client.attributes`: its attribute
    names; input and output JSON unless a string, metadata one attribute per key with every value
    JSON, compact; its instrumentation scope, which the server reads as the SDK's), built directly as
    OpenTelemetry `ReadableSpan`s: no tracer, context or processor per span, and no media scan of
    every string (we send no media). The exporter takes them as it takes the SDK's."""

    def __init__(self, creds: Credentials, environment: str):
        from importlib.metadata import version

        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.environment = environment  # LANGFUSE_TRACING_ENVIRONMENT: the spans' and the scores'
        self._resource = Resource.create({"service.name": "grpo-sentinel"})
        self._scope = InstrumentationScope("langfuse-sdk", version("langfuse"), None, {"public_key": creds.public_key})

    def span(self, name: str, trace_id: int, span_id: int, parent: int | None, trace: dict, as_type: str, input,
             output, metadata: dict, start_ns: int, *, model: str | None = None, model_parameters: dict | None = None,
             usage_details: dict | None = None):
        """One observation, ended now. `trace`: the trace-level attributes every span of a trace carries."""
        from opentelemetry.sdk.trace import ReadableSpan
        from opentelemetry.trace import SpanContext, TraceFlags

        a = {"langfuse.observation.type": as_type, "langfuse.environment": self.environment, **trace}
        if parent is None:
            a["langfuse.internal.is_app_root"] = True
        for key, value in (("input", input), ("output", output), ("model.parameters", model_parameters),
                           ("usage_details", usage_details)):
            if value is not None:
                a[f"langfuse.observation.{key}"] = value if isinstance(value, str) else json.dumps(value)
        if model is not None:
            a["langfuse.observation.model.name"] = model
        for key, value in metadata.items():
            if value is not None:  # the SDK skips None, so an update never overwrites a value
                a[f"langfuse.observation.metadata.{key}"] = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        sampled = TraceFlags(TraceFlags.SAMPLED)
        return ReadableSpan(name, SpanContext(trace_id, span_id, False, sampled),
                            None if parent is None else SpanContext(trace_id, parent, False, sampled),
                            self._resource, a, instrumentation_scope=self._scope, start_time=start_ns,
                            end_time=time.time_ns())
