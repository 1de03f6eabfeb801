"""The daemon's HTTP API (FastAPI): runs are submitted with the same typed config as `train`, so
validation errors and the OpenAPI document come from one model.

Probes and scrapes (`/healthz`, `/readyz`, `/metrics`) are open; everything under `/v1` needs the
bearer token when the daemon has one (it must, beyond loopback). Every bad request is a 4xx that says
what to fix: a body over the size limit 413, not JSON 415, an invalid or inadmissible config 422 (the
same one-paragraph message `train` prints, and the field list). A damaged file in one run's directory
makes that run `damaged`; it never fails a read of the others.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import threading
import urllib.request
from collections.abc import AsyncIterable
from typing import Literal

import anyio
from fastapi import Depends, FastAPI, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.sse import EventSourceResponse, ServerSentEvent
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from grpo_sentinel.service.config import Config, format_error_list
from grpo_sentinel.service.daemon.admission import Admission
from grpo_sentinel.service.daemon.follow import Cursor, RunTail
from grpo_sentinel.service.daemon.supervisor import Supervisor
from grpo_sentinel.service.runs import FINISHED, RunDir, RunDirError
from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.links import links as langfuse_links
from grpo_sentinel.telemetry.record import last_row
from grpo_sentinel.telemetry.traces import credentials_from_env

log = logging.getLogger(__name__)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")


class Submitted(BaseModel):
    id: str
    status: str


class RunBrief(BaseModel):
    id: str
    status: str
    step: int
    steps: int


class Condition(BaseModel):
    id: str
    severity: str
    cause: str
    action: str


class RunDetail(RunBrief):
    submitted_at: str | None = None
    attempt: int | None = None
    error: str | None = None
    metrics: dict[str, float | str] = {}
    conditions: list[Condition] = []
    baseline: dict | None = None
    last_eval: dict | None = None
    traces: dict[str, str | list[str]] = {}
    events: list[dict] = []


def create_app(supervisor: Supervisor, token: str | None, admission: Admission | None = None,
               hosts: tuple[str, ...] | None = None) -> FastAPI:
    """`hosts`: on a daemon without a token, the Host names it answers (loopback names always), so that a
    web page cannot reach it through a name that resolves to 127.0.0.1 (DNS rebinding)."""
    admission = admission or Admission()
    app = FastAPI(title="grpo-sentinel", version="0.1.0",
                  description="GRPO training service: submit runs, follow them, read their record and health report.")
    app.add_middleware(Guard, body_bytes=admission.limits.body_bytes,
                       hosts=None if hosts is None else frozenset((*LOOPBACK_NAMES, *hosts)))
    bearer = HTTPBearer(auto_error=False)

    def authorised(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is not None and (creds is None or not secrets.compare_digest(creds.credentials.encode(), token.encode())):
            raise HTTPException(401, "a valid bearer token is required (Authorization: Bearer $GRPO_SENTINEL_API_TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        return refused(list(e.errors()))

    @app.exception_handler(Exception)
    async def failed(request: Request, e: Exception):  # a bug of ours: said, logged, never a stack trace
        log.exception("%s %s failed", request.method, request.url.path)
        return JSONResponse({"message": f"internal error ({type(e).__name__}); see the daemon's log"}, status_code=500)

    def run_of(run_id: str):
        run = supervisor.run_dir(run_id)
        if run is None:
            raise HTTPException(404, f"no run {run_id!r}")
        return run

    @app.get("/healthz", tags=["probes"])
    def healthz() -> dict[str, str]:
        """The process is alive."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"], responses={503: {"description": "not ready"}})
    def readyz() -> JSONResponse:
        """Ready to accept work (or running it)."""
        ok = supervisor.ready
        return JSONResponse({"status": "ready" if ok else "not ready"}, status_code=200 if ok else 503)

    @app.get("/metrics", tags=["probes"], response_class=PlainTextResponse)
    def metrics() -> Response:
        """The daemon's own metrics and the active run's: one scrape target per pod."""
        body = generate_latest(supervisor.registry)
        child = supervisor.child
        try:
            port = supervisor.run_dir(child.run_id).read_summary().get("metrics_port") if child else None
        except RunDirError:
            port = None
        if port:
            try:
                body += urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            except OSError:
                pass  # the run is starting or ending: its series are simply absent from this scrape
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/runs", status_code=201, dependencies=[Depends(authorised)], tags=["runs"],
              responses={409: {"description": "the run id is taken"}, 413: {"description": "the body is too large"},
                         415: {"description": "the body is not JSON"},
                         422: {"description": "invalid config, or one this daemon does not admit"},
                         507: {"description": "the state directory is full or read-only; nothing was queued"}})
    def submit(cfg: Config) -> Submitted:
        """Queue a run. The body is the same config as `grpo-sentinel train` takes, as JSON (`{}` is the demo).
        Rewards must be built-ins or in the daemon's reward modules; paths under its allowed paths."""
        cfg, errors = admission.admit(cfg)
        if errors:
            return refused(errors)
        try:
            return Submitted(id=supervisor.submit(cfg), status="queued")
        except RunDirError as e:
            raise HTTPException(409, str(e)) from None
        except OSError as e:  # a full or read-only state volume: nothing was queued
            raise HTTPException(507, f"cannot write the run into the state directory: {e.strerror or e}; "
                                     "nothing was queued") from None

    @app.get("/v1/runs", dependencies=[Depends(authorised)], tags=["runs"])
    def runs() -> list[RunBrief]:
        """Every run the daemon knows, in submission order (`damaged`: its summary cannot be read)."""
        out = []
        for run_id in supervisor.run_ids():
            rd = supervisor.run_dir(run_id)
            try:
                s = rd.read_summary()
            except RunDirError:
                out.append(RunBrief(id=run_id, status="damaged", step=0, steps=0))
                continue
            out.append(RunBrief(id=run_id, status=s.get("status", "queued"), step=_step(rd, s), steps=s.get("steps", 0)))
        return out

    @app.get("/v1/runs/{run_id}", dependencies=[Depends(authorised)], tags=["runs"])
    def run(run_id: str) -> RunDetail:
        """Status, progress, the latest step's metrics, the health conditions active now (with cause and
        action), accuracy before training and at the last evaluation, the error of a failed run, and
        links to its traces in Langfuse."""
        rd = run_of(run_id)
        try:
            s = rd.read_summary()
        except RunDirError as e:
            return RunDetail(id=run_id, status="damaged", step=0, steps=0, error=str(e), events=rd.events()[-20:])
        row = last_row(rd.path / "steps.csv") if (rd.path / "steps.csv").is_file() else {}
        conditions = [Condition(id=c, severity=BY_ID[c].severity, cause=BY_ID[c].cause, action=BY_ID[c].action)
                      for c in (row.get("health") or "").split() if c in BY_ID]
        metrics = {k: _number(v) for k, v in row.items()
                   if isinstance(k, str) and isinstance(v, str) and v != "" and k not in ("health", "trace_ids", "eval_trace_id")}
        traces: dict[str, str | list[str]] = {}
        try:
            creds = credentials_from_env()
            links = langfuse_links(rd.read_config().traces.project_id, creds.base_url) if creds else None
        except RunDirError:  # a damaged config.yaml: the rest of the run still reads
            links = None
        ids = (row.get("trace_ids") or "").split()
        if links is not None and (ids or (rd.path / "steps.csv").is_file()):
            traces = {"session": links.session(run_id), "latest_step": [links.trace(t) or t for t in ids]}
        return RunDetail(id=run_id, status=s.get("status", "queued"), step=_step(rd, s, row), steps=s.get("steps", 0),
                         submitted_at=s.get("submitted_at"), attempt=s.get("attempt"),
                         error=s.get("reason") if s.get("status") == "failed" else None, metrics=metrics,
                         conditions=conditions, baseline=s.get("baseline"), last_eval=s.get("final_eval"),
                         traces=traces, events=rd.events()[-20:])

    @app.post("/v1/runs/{run_id}/stop", dependencies=[Depends(authorised)], tags=["runs"])
    def stop(run_id: str) -> Submitted:
        """The running run checkpoints at its step boundary and ends `stopped`; a queued one is removed."""
        run_of(run_id)
        return Submitted(id=run_id, status=supervisor.stop(run_id))

    @app.post("/v1/runs/{run_id}/resume", dependencies=[Depends(authorised)], tags=["runs"],
              responses={409: {"description": "the run has not failed"}})
    def resume(run_id: str) -> Submitted:
        """Queue a failed run again (say, once its full disk has room): it continues from its newest checkpoint."""
        run_of(run_id)
        try:
            return Submitted(id=run_id, status=supervisor.resume(run_id))
        except RunDirError as e:
            raise HTTPException(409, str(e)) from None
        except OSError as e:
            raise HTTPException(507, f"cannot write the run's summary: {e.strerror or e}") from None

    @app.get("/v1/runs/{run_id}/record", dependencies=[Depends(authorised)], tags=["runs"],
             response_class=PlainTextResponse)
    def record(run_id: str, file: Literal["steps", "reward-vs-step"] = "steps") -> Response:
        """The run record as CSV: `steps.csv` (every step) or `reward-vs-step.csv` (the sampling rows)."""
        path = run_of(run_id).path / f"{file}.csv"
        if not path.is_file():
            raise HTTPException(404, f"run {run_id!r} has no {path.name} yet")
        return Response(path.read_bytes(), media_type="text/csv")

    @app.get("/v1/runs/{run_id}/report", dependencies=[Depends(authorised)], tags=["runs"],
             response_class=PlainTextResponse)
    def report(run_id: str) -> Response:
        """The `grpo-sentinel diagnose` markdown report of the run so far."""
        from grpo_sentinel.telemetry.health.detectors import diagnose
        from grpo_sentinel.telemetry.health.ingest import load
        from grpo_sentinel.telemetry.health.report import to_markdown, with_generations
        from grpo_sentinel.telemetry.health.thresholds import configured, detector_window

        path = run_of(run_id).path
        if not (path / "steps.csv").is_file():
            raise HTTPException(404, f"run {run_id!r} has not recorded a step yet")
        try:
            runlog = load(path)
        except (ValueError, OSError) as e:
            raise HTTPException(409, f"run {run_id!r}: its record cannot be read ({e})") from None
        th = configured(detector_window(runlog.window, runlog.completions_per_step), runlog.thresholds)
        return Response(to_markdown(with_generations(diagnose(runlog, th), runlog), runlog, th), media_type="text/markdown")

    app.state.stopping = threading.Event()  # set when the daemon begins to shut down: the streams end first

    def cursor_of(last_event_id: str | None = Header(None)) -> Cursor:
        """A dependency, so that a bad id is a 400 before the stream's 200 is sent."""
        try:
            return Cursor.parse(last_event_id)
        except ValueError as e:
            raise HTTPException(400, str(e)) from None

    @app.get("/v1/runs/{run_id}/events", dependencies=[Depends(authorised)], tags=["runs"],
             response_class=EventSourceResponse, responses={400: {"description": "a Last-Event-ID this stream did not send"}})
    async def events(run_id: str, rd: RunDir = Depends(run_of), follow: bool = False,
                     since: Cursor = Depends(cursor_of)) -> AsyncIterable[ServerSentEvent]:
        """The run's history, then (with `follow=true`) its progress as it happens, as server-sent events:
        `status` {status, step, steps, attempt} at the start and when it changes; `event` each entry of
        its events.jsonl (created, started, resumed, config_changed, ended); `step` each steps.csv row
        (numbers as numbers, empty columns left out); `condition` {id, step, severity, cause, action}
        when a health condition begins; `end` {id, status, step, steps, reason, baseline, final_eval}
        once the run has ended (`removed`: stopped while queued; `damaged`: its summary.json cannot be
        read) and its process has exited, which
        ends the stream; `closing` when the daemon shuts down (reconnect: a restarted daemon resumes
        the run and the stream). Each event's id is a cursor: sent back as `Last-Event-ID`, the stream
        resumes after it, so a reconnecting follower sees no step or event twice."""
        tail = RunTail(rd.path, since)
        while True:
            child = supervisor.child  # read before the files: a run with no process left has written them all
            busy = child is not None and child.run_id == run_id
            if supervisor.run_dir(run_id) is None:
                yield ServerSentEvent(event="end", data={"id": run_id, "status": "removed"}, id=str(tail.cursor))
                return
            items, summary = await anyio.to_thread.run_sync(tail.poll)  # file reads: never on the event loop
            for kind, data, cursor in items:
                yield ServerSentEvent(event=kind, data=_wire(kind, data), id=str(cursor))
            if summary.get("status") in (*FINISHED, "damaged") and not busy:
                yield ServerSentEvent(event="end", id=str(tail.cursor), data={
                    "id": run_id, **{k: summary.get(k) for k in ("status", "step", "steps", "reason", "baseline", "final_eval")}})
                return
            if not follow:
                return
            if app.state.stopping.is_set():
                yield ServerSentEvent(event="closing", id=str(tail.cursor), data={"reason": "the daemon is shutting down"})
                return
            await asyncio.sleep(FOLLOW_POLL_S)

    return app


def refused(errors: list[dict]) -> JSONResponse:
    """A 422: the one-paragraph message `train` prints for a bad config, and the field list. Only what JSON
    carries goes out: pydantic's raw entries hold the input (perhaps huge, NaN or bytes) and exceptions."""
    errors = [{**e, "loc": [p for p in e["loc"] if p != "body"]} for e in errors]
    message = format_error_list([_readable(e) for e in errors])
    detail = [{"loc": e["loc"], "msg": str(e["msg"]), "type": str(e["type"])} for e in errors]
    return JSONResponse({"message": message, "detail": detail}, status_code=422)


def _readable(err: dict) -> dict:
    if err["type"] == "json_invalid":  # where the JSON broke, rather than pydantic's bare "JSON decode error"
        return {**err, "loc": ["body"], "msg": f"not valid JSON: {err.get('ctx', {}).get('error', 'decode error')} "
                                              f"(at character {err['loc'][-1] if err['loc'] else 0})"}
    return err


class Guard:
    """ASGI middleware in front of every route: the Host check of a tokenless daemon, and the body limits
    (size, and JSON for a submission) enforced before anything parses the body."""

    def __init__(self, app, body_bytes: int, hosts: frozenset[str] | None):
        self.app, self.body_bytes, self.hosts = app, body_bytes, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if self.hosts is not None and _hostname(headers.get("host", "")) not in self.hosts:
            return await _answer(send, 421, "this daemon answers requests for a loopback address only (it has no API "
                                            "token); set GRPO_SENTINEL_API_TOKEN to serve other names")
        if scope["method"] == "POST" and scope["path"] == "/v1/runs":
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                return await _answer(send, 415, f"the body must be a JSON run config (Content-Type: application/json; "
                                                f"got {kind or 'none'!r})")
        size = headers.get("content-length", "")
        if size.isdigit() and int(size) > self.body_bytes:
            return await _answer(send, 413, f"the body is {int(size)} bytes; this daemon takes at most "
                                            f"{self.body_bytes} (limits.body_bytes)")
        received = 0

        async def bounded():  # a body sent without Content-Length (chunked) is counted as it arrives
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.body_bytes:  # an HTTPException: FastAPI's body reader passes it on as the answer
                raise HTTPException(413, f"the body is over {self.body_bytes} bytes (limits.body_bytes)")
            return message

        await self.app(scope, bounded, send)


def _hostname(host: str) -> str:
    """'127.0.0.1:8000' -> '127.0.0.1'; '[::1]:8000' -> '::1'."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


async def _answer(send, status: int, message: str) -> None:
    body = json.dumps({"detail": message}).encode()  # as FastAPI answers an HTTPException
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# How often a followed run's files are looked at: a step is seen within this of being recorded, and a
# follower's stream ends within it of the daemon's SIGTERM.
FOLLOW_POLL_S = 0.25


def _wire(kind: str, data: dict) -> dict:
    """An event as the stream sends it: a step row's numbers as numbers, a condition with its meaning."""
    if kind == "step":  # the step as the integer it is: the cursor counts steps
        return {**{k: _number(v) for k, v in data.items() if v != ""}, "step": int(data["step"])}
    if kind == "condition" and data["id"] in BY_ID:
        c = BY_ID[data["id"]]
        return {**data, "severity": c.severity, "cause": c.cause, "action": c.action}
    return data


def _step(rd, summary: dict, row: dict | None = None) -> int:
    """The last step done: the record's newest row while the run trains, the summary's once it ended."""
    if summary.get("status") != "running":
        return summary.get("step", 0)
    row = row if row is not None else last_row(rd.path / "steps.csv") if (rd.path / "steps.csv").is_file() else {}
    return int(row.get("step") or summary.get("step", 0))


def _number(v: str) -> float | str:
    try:
        x = float(v)
    except ValueError:
        return v
    return x if math.isfinite(x) else v


def openapi_json() -> str:
    """docs/openapi.json, generated (`grpo-sentinel generate`): the API's document, from the app itself."""
    from pathlib import Path

    return json.dumps(create_app(Supervisor(Path("unused")), None).openapi(), indent=2, sort_keys=True) + "\n"
