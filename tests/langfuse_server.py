"""A strict local stand-in for a Langfuse server (no Langfuse server can run here: it needs Docker and a
recent ClickHouse). Every rule below was read from the server's source, github `langfuse/langfuse`
at tag **v4.16.0**, in the file named with it; where the stand-in is stricter or narrower, it says so.

Every route: Basic auth with public:secret key, else 401 `{"message"}`
(`web/src/features/public-api/server/createAuthedProjectAPIRoute.ts`, `web/src/pages/api/public/ingestion.ts`).

`POST /api/public/otel/v1/traces` (`web/src/pages/api/public/otel/v1/traces/index.ts`):
- `Content-Encoding` containing gzip is gunzipped (a body that is not gzip: 400);
- `Content-Type` must contain `application/x-protobuf` or `application/json`, else 400 "Invalid
  content type"; a protobuf `ExportTraceServiceRequest` that does not decode: 400. (The server also
  takes OTLP/JSON; the stand-in decodes protobuf only and answers JSON with 400, said.)
- `x-langfuse-ingestion-version`, read as JS `parseInt`: not a number or above 4: 400;
- a span without a trace id or span id fails the whole export with 400 (`validateOtelSpanIds`,
  `packages/shared/src/server/otel/utils.ts`). Stricter than the server, which turns any byte string
  into hex: the OTLP proto's own rule (`opentelemetry/proto/trace/v1/trace.proto`), a trace id is 16
  bytes, a span id 8, a parent span id empty or 8 (another length would be stored under an id nothing
  else names);
- success: 200 with a JSON body.
Spans are rebuilt into observations and traces as the v4 events path does
(`packages/shared/src/server/otel/OtelIngestionProcessor.ts` `processToEvent`; the trace aggregation in
`packages/shared/src/server/queries/clickhouse-sql/event-query-builder.ts` `EVENTS_AGGREGATION_FIELDS`):
an observation's metadata is its `langfuse.observation.metadata.*` overridden by the span's
`langfuse.trace.metadata.*` on the same keys; a trace's input, output and metadata are those of its span
with no parent (`parent_span_id = ''`), its session and tags from any span that has them, its name the
`langfuse.trace.name`; environment normalised as `PublicEnvironmentName`
(`packages/shared/src/server/ingestion/types.ts`).

`POST /api/public/scores` (`web/src/pages/api/public/scores/index.ts`, body schema `PostScoresBodyV1` =
`PostScoresBody`, `packages/shared/src/features/scores/interfaces/api/shared.ts` with
`PostScoreBodyFoundationSchema`, `.../interfaces/shared.ts`): **one** score object (a JSON list is a
400), answered 200 `{"id"}`.

`POST /api/public/ingestion` (`web/src/pages/api/public/ingestion.ts`, `processEventBatch.ts`; event
schemas in `packages/shared/src/server/ingestion/types.ts`): `{"batch": [...], "metadata"?}`, else 400;
each event validated on its own, answered 207 `{"successes": [{"id", "status": 201}], "errors": [{"id",
"status": 400, "message": "Invalid request data", "error"}]}`. Only `score-create` events are kept:
other types get a 400 per event, as a v4 deployment in `events_only` mode answers them.

Score bodies, both routes (`ScoreBody` in types.ts, `PostScoresBody`): `name` a non-empty string;
`id`, `traceId`, `observationId`, `sessionId`, `datasetRunId`, `comment`, `configId`, `queueId` strings or
null; exactly one of traceId, sessionId, datasetRunId, and observationId only with traceId
(`applyScoreValidation`, `packages/shared/src/utils/scores.ts`); `dataType` NUMERIC (a number), BOOLEAN
(0 or 1), CATEGORICAL or CORRECTION (a string), TEXT (1-500 characters) or absent (a string or a number);
`source` API, EVAL or ANNOTATION (scores route: API or ANNOTATION, which needs a configId). The ingestion
route's ids are `idSchema` (1-800 characters, no carriage return) and the event needs an ISO timestamp with
an offset; its environment never fails (normalised, else "default"), the scores route's must be a string.
JSON with NaN or Infinity does not parse (JSON.parse): 400.

On demand: `fail(route, status, times)` answers a route ("otel", "scores", "ingestion") with that
status (400, 403, 429, 5xx); `event_status(event)` gives single ingestion events an error status (207
partial results). Everything received is kept, decoded, for the tests to read.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

OTLP, SCORES, INGESTION = "/api/public/otel/v1/traces", "/api/public/scores", "/api/public/ingestion"
ROUTES = {OTLP: "otel", SCORES: "scores", INGESTION: "ingestion"}
TEXT_SCORE_MAX_LENGTH = 500  # packages/shared/src/domain/scores.ts
# z.iso.datetime({offset: true}) under zod 4 (the server's): seconds required, any fraction, Z or an offset
ISO_WITH_OFFSET = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    return getattr(v, kind) if kind else None


def _json(raw: str):
    """An SDK 5 attribute value: JSON-encoded (strings too); a raw string stays as it is."""
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def environment(value) -> str:
    """PublicEnvironmentName: lowercase, leading 'langfuse' prefixes stripped, 40 characters, [a-z0-9-_]+,
    else (and for anything not a string) 'default'."""
    if not isinstance(value, str):
        return "default"
    v = re.sub(r"^(?:langfuse[-_]?)+", "", value.lower())[:40]
    return v if v and re.fullmatch(r"[a-z0-9-_]+", v) else "default"


def _nullish_str(body: dict, key: str, errors: list[str]) -> None:
    if body.get(key) is not None and not isinstance(body[key], str):
        errors.append(f"{key}: expected string or null")


def _id(value, where: str, errors: list[str], required: bool) -> None:
    """idSchema: a string of 1-800 characters without a carriage return."""
    if value is None:
        if required:
            errors.append(f"{where}: required")
    elif not isinstance(value, str) or not 1 <= len(value) <= 800 or "\r" in value:
        errors.append(f"{where}: expected an id (a string of 1-800 characters, no carriage return)")


def _id_problems(sp) -> list[str]:
    """validateOtelSpanIds (ids present), and the OTLP proto's lengths."""
    out = [f"{k}: absent" if not v else f"{k}: {len(v)} bytes, not {n}"
           for k, v, n in (("traceId", sp.trace_id, 16), ("spanId", sp.span_id, 8)) if len(v) != n]
    if sp.parent_span_id and len(sp.parent_span_id) != 8:
        out.append(f"parentSpanId: {len(sp.parent_span_id)} bytes, not 8")
    return out


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def score_errors(body, route: str) -> list[str]:
    """What the server's score schema says is wrong with `body` ([] when it is valid)."""
    if not isinstance(body, dict):
        return [f"expected one score object, received {type(body).__name__}"]
    errors: list[str] = []
    if route == "ingestion":
        _id(body.get("id"), "id", errors, required=False)
    else:
        _nullish_str(body, "id", errors)
        if "environment" in body and not isinstance(body["environment"], str):
            errors.append("environment: expected string")
    if not isinstance(body.get("name"), str) or not body["name"]:
        errors.append("name: expected a non-empty string")
    for key in ("traceId", "sessionId", "datasetRunId", "observationId", "comment", "configId", "queueId",
                *(("executionTraceId",) if route == "ingestion" else ())):
        _nullish_str(body, key, errors)
    sources = ("API", "EVAL", "ANNOTATION") if route == "ingestion" else ("API", "ANNOTATION")
    if body.get("source", "API") not in sources:
        errors.append(f"source: expected one of {sources}")
    value, kind = body.get("value"), body.get("dataType")
    ok = {"NUMERIC": _number(value), "BOOLEAN": _number(value) and value in (0, 1),
          "CATEGORICAL": isinstance(value, str), "CORRECTION": isinstance(value, str),
          "TEXT": isinstance(value, str) and 1 <= len(value) <= TEXT_SCORE_MAX_LENGTH,
          None: isinstance(value, str) or _number(value)}
    if kind not in ok:
        errors.append(f"dataType: invalid discriminator value {kind!r}")
    elif not ok[kind]:
        errors.append(f"value: {value!r} does not fit dataType {kind}")
    if kind == "CORRECTION" and body.get("configId") is not None:
        errors.append("configId: a CORRECTION score cannot have a config")
    subjects = [k for k in ("traceId", "sessionId", "datasetRunId") if body.get(k)]
    if len(subjects) != 1 or (body.get("observationId") and subjects != ["traceId"]):
        errors.append("Provide exactly one of the following: traceId (with optional observationId), sessionId or "
                      "datasetRunId. ObservationId requires traceId.")
    if route == "scores" and body.get("source") == "ANNOTATION" and not body.get("configId"):
        errors.append("configId: an annotation score requires a configId")
    return errors


def event_errors(event) -> list[str]:
    """The ingestion event schema (types.ts `base` + `scoreEvent`)."""
    if not isinstance(event, dict):
        return ["expected an event object"]
    errors: list[str] = []
    _id(event.get("id"), "id", errors, required=True)
    if not isinstance(event.get("timestamp"), str) or not ISO_WITH_OFFSET.match(event["timestamp"]):
        errors.append("timestamp: expected an ISO 8601 datetime with an offset")
    if event.get("type") != "score-create":
        errors.append(f"Event type {event.get('type')!r} is not accepted (events_only: scores and logs only)")
    else:
        errors += [f"body.{e}" for e in score_errors(event.get("body"), "ingestion")]
    return errors


@dataclass
class Trace:
    """A trace as the v4 events path aggregates its spans."""

    id: str
    spans: list[dict] = field(default_factory=list)

    @property
    def root(self) -> dict | None:
        """The span with no parent (parent_span_id = '')."""
        return next((s for s in self.spans if not s["parent_id"]), None)

    @property
    def input(self):
        return self.root["input"] if self.root else None

    @property
    def output(self):
        return self.root["output"] if self.root else None

    @property
    def metadata(self) -> dict:
        return self.root["metadata"] if self.root else {}

    @property
    def name(self) -> str | None:
        return next(
            (s["attributes"]["langfuse.trace.name"] for s in self.spans if "langfuse.trace.name" in s["attributes"]),
            None,
        )

    @property
    def session_id(self) -> str | None:
        return next((s["attributes"]["session.id"] for s in self.spans if s["attributes"].get("session.id")), None)

    @property
    def tags(self) -> tuple:
        return next(
            (s["attributes"]["langfuse.trace.tags"] for s in self.spans if s["attributes"].get("langfuse.trace.tags")),
            (),
        )

    @property
    def generations(self) -> list[dict]:
        return [s for s in self.spans if s["type"] == "generation"]


def _observation(sp, resource: dict) -> dict:
    """One span as the server reads it (the Langfuse SDK's attributes)."""
    a = {kv.key: _value(kv.value) for kv in sp.attributes}

    def prefixed(prefix: str) -> dict:
        return {k[len(prefix) + 1:]: _json(v) for k, v in a.items() if k.startswith(prefix + ".")}

    return {"trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(), "parent_id": sp.parent_span_id.hex(),
            "name": sp.name, "attributes": a, "type": a.get("langfuse.observation.type", "span"),
            "input": _json(a.get("langfuse.observation.input")), "output": _json(a.get("langfuse.observation.output")),
            "model": a.get("langfuse.observation.model.name"),
            "environment": environment(next((src[k] for k in ("langfuse.environment", "deployment.environment.name",
                                                              "deployment.environment") for src in (a, resource)
                                             if src.get(k)), "default")),
            # processToEvent: {...spanMetadata, ...traceMetadata}: trace metadata wins on a shared key
            "metadata": {**prefixed("langfuse.observation.metadata"), **prefixed("langfuse.trace.metadata")}}


class FakeLangfuse:
    def __init__(self, public_key: str = "pk-lf-test", secret_key: str = "sk-lf-test"):
        self.auth = "Basic " + base64.b64encode(f"{public_key}:{secret_key}".encode()).decode()
        self.spans: list[dict] = []
        self.scores: dict[str, dict] = {}  # score id -> the score as stored (upserted by id)
        self.requests: list[dict] = []  # every request: path, headers, raw body, the status answered
        self.rejected = 0  # requests refused for their keys
        self.refused: list[dict] = []  # what was refused for its content: route, status, errors
        self._failing: dict[str, list[int]] = {}
        self.event_status: Callable[[dict], int | None] = lambda event: None
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                record = {"path": self.path, "headers": dict(self.headers), "body": body}
                server.requests.append(record)
                code, answer = server._handle(self.path, self.headers, body)
                record["status"] = code
                data = json.dumps(answer).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_port}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    def fail(self, route: str, status: int, times: int = 1_000_000) -> None:
        """Answer the next `times` requests to `route` ("otel", "scores", "ingestion") with `status`."""
        self._failing[route] = [status] * times

    # -- the routes ----------------------------------------------------------------------------

    def _handle(self, path: str, headers, body: bytes) -> tuple[int, dict]:
        route = ROUTES.get(path)
        if route is None:
            return 404, {"message": "Not found"}
        if headers.get("Authorization") != self.auth:
            self.rejected += 1
            return 401, {"message": "Invalid credentials"}
        with self._lock:
            failing = self._failing.get(route)
            status = failing.pop() if failing else None
        if status is not None:
            return status, {"message": f"stand-in: {route} answers {status} on demand"}
        if route == "otel":
            return self._otlp(headers, body)
        ctype = (headers.get("Content-Type") or "").lower()
        if "application/json" not in ctype:  # Next.js parses only a JSON body; any other is a string to the schema
            return self._refuse(route, 400, [f"the body is not JSON to the server (Content-Type {ctype!r})"])
        try:
            parsed = json.loads(body, parse_constant=_not_json)  # JSON.parse: no NaN, no Infinity
        except ValueError as e:
            return self._refuse(route, 400, [f"Invalid JSON ({e})"])
        return self._scores(parsed) if route == "scores" else self._ingestion(parsed)

    def _refuse(self, route: str, status: int, errors: list[str]) -> tuple[int, dict]:
        self.refused.append({"route": route, "status": status, "errors": errors})
        return status, {"message": "Invalid request data", "errors": errors}

    def _otlp(self, headers, body: bytes) -> tuple[int, dict]:
        if "gzip" in (headers.get("Content-Encoding") or ""):
            try:
                body = gzip.decompress(body)
            except (OSError, EOFError):
                return self._refuse("otel", 400, ["Failed to decompress request body"])
        ctype = (headers.get("Content-Type") or "").lower()
        if "application/x-protobuf" not in ctype:
            why = "OTLP/JSON: the server takes it, this stand-in decodes protobuf only" if "application/json" in ctype \
                else "Invalid content type"
            return self._refuse("otel", 400, [why])
        version = headers.get("x-langfuse-ingestion-version")
        if version is not None:
            digits = re.match(r"\s*[+-]?\d+", version)  # parseInt
            if not digits or int(digits.group()) > 4:
                return self._refuse(
                    "otel", 400, [f'Unsupported x-langfuse-ingestion-version: "{version}". Maximum supported: "4".']
                )
        try:
            req = ExportTraceServiceRequest.FromString(body)
        except DecodeError:
            return self._refuse("otel", 400, ["Failed to parse OTel Protobuf Trace"])
        spans = [(sp, {kv.key: _value(kv.value) for kv in rs.resource.attributes})
                 for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        bad = [f"span {sp.name!r}: {', '.join(wrong)}" for sp, _ in spans if (wrong := _id_problems(sp))]
        if bad:
            return self._refuse("otel", 400, [f"Invalid OTLP trace export: {len(bad)} of {len(spans)} span(s) "
                                              f"cannot be processed", *bad[:5]])
        self.spans += [_observation(sp, resource) for sp, resource in spans]
        return 200, {}

    def _scores(self, body) -> tuple[int, dict]:
        errors = score_errors(body, "scores")
        if errors:
            return self._refuse("scores", 400, errors)
        self._keep(body)
        return 200, {"id": body.get("id") or ""}

    def _ingestion(self, body) -> tuple[int, dict]:
        if not isinstance(body, dict) or not isinstance(body.get("batch"), list):
            return self._refuse("ingestion", 400, ['expected {"batch": [...]}'])
        successes, errors = [], []
        for event in body["batch"]:
            eid = event.get("id") if isinstance(event, dict) and isinstance(event.get("id"), str) else "unknown"
            wrong = event_errors(event)
            status = 400 if wrong else self.event_status(event)
            if status is None:
                self._keep(event["body"])
                successes.append({"id": eid, "status": 201})
            else:
                errors.append({"id": eid, "status": status, "message": "Invalid request data" if wrong else "stand-in",
                               "error": "; ".join(wrong) or f"answered {status} on demand"})
        if errors:
            self.refused.append({"route": "ingestion", "status": 207, "errors": errors})
        return 207, {"successes": successes, "errors": errors}

    def _keep(self, score: dict) -> None:
        stored = {**score, "environment": environment(score.get("environment", "default")),
                  "source": score.get("source", "API")}
        self.scores[score.get("id") or f"generated-{len(self.scores)}"] = stored

    # -- what it holds -------------------------------------------------------------------------

    def traces(self) -> dict[str, Trace]:
        """trace id -> the trace its spans make."""
        out: dict[str, Trace] = {}
        for s in self.spans:
            out.setdefault(s["trace_id"], Trace(s["trace_id"])).spans.append(s)
        return out

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
