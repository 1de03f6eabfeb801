"""The daemon's HTTP API (FastAPI): runs are submitted with the same typed config as `train`, so
validation errors and the OpenAPI document come from one model.

Probes and scrapes (`/healthz`, `/readyz`, `/metrics`) are open; everything under `/v1` needs the
bearer token when the daemon has one (it must, beyond loopback).
"""

from __future__ import annotations

import math
import secrets
import urllib.request
from typing import Literal

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel

from grpo_sentinel.service.config import Config, format_error_list
from grpo_sentinel.service.daemon.supervisor import Supervisor
from grpo_sentinel.telemetry.record import last_row
from grpo_sentinel.service.runs import RunDirError
from grpo_sentinel.telemetry.health.table import BY_ID
from grpo_sentinel.telemetry.traces import credentials_from_env, links_from


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


def create_app(supervisor: Supervisor, token: str | None) -> FastAPI:
    app = FastAPI(title="grpo-sentinel", version="0.1.0",
                  description="GRPO training service: submit runs, follow them, read their record and health report.")
    bearer = HTTPBearer(auto_error=False)

    def authorised(creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if token is not None and (creds is None or not secrets.compare_digest(creds.credentials.encode(), token.encode())):
            raise HTTPException(401, "a valid bearer token is required (Authorization: Bearer $GRPO_SENTINEL_API_TOKEN)",
                                headers={"WWW-Authenticate": "Bearer"})

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError):
        # FastAPI's error list, plus the same one-paragraph message `train` prints for a bad config.
        errors = [{**err, "loc": [p for p in err["loc"] if p != "body"]} for err in e.errors()]
        return JSONResponse({"message": format_error_list(errors), "detail": errors}, status_code=422)

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
        port = supervisor.run_dir(child.run_id).read_summary().get("metrics_port") if child else None
        if port:
            try:
                body += urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
            except OSError:
                pass  # the run is starting or ending: its series are simply absent from this scrape
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/runs", status_code=201, dependencies=[Depends(authorised)], tags=["runs"],
              responses={409: {"description": "the run id is taken"}, 422: {"description": "invalid config"},
                         507: {"description": "the state directory is full or read-only"}})
    def submit(cfg: Config) -> Submitted:
        """Queue a run. The body is the same config as `grpo-sentinel train` takes, as JSON (`{}` is the demo)."""
        try:
            return Submitted(id=supervisor.submit(cfg), status="queued")
        except RunDirError as e:
            raise HTTPException(409, str(e)) from None
        except OSError as e:  # a full or read-only state volume: nothing was queued
            raise HTTPException(507, f"cannot write the run into the state directory: {e.strerror or e}") from None

    @app.get("/v1/runs", dependencies=[Depends(authorised)], tags=["runs"])
    def runs() -> list[RunBrief]:
        """Every run the daemon knows, in submission order."""
        out = []
        for run_id in supervisor.run_ids():
            rd = supervisor.run_dir(run_id)
            s = rd.read_summary()
            out.append(RunBrief(id=run_id, status=s.get("status", "queued"), step=_step(rd, s), steps=s.get("steps", 0)))
        return out

    @app.get("/v1/runs/{run_id}", dependencies=[Depends(authorised)], tags=["runs"])
    def run(run_id: str) -> RunDetail:
        """Status, progress, the latest step's metrics, the health conditions active now (with cause and
        action), accuracy before training and at the last evaluation, the error of a failed run, and
        links to its traces in Langfuse."""
        rd = run_of(run_id)
        s = rd.read_summary()
        row = last_row(rd.path / "steps.csv") if (rd.path / "steps.csv").is_file() else {}
        conditions = [Condition(id=c, severity=BY_ID[c].severity, cause=BY_ID[c].cause, action=BY_ID[c].action)
                      for c in row.get("health", "").split() if c in BY_ID]
        metrics = {k: _number(v) for k, v in row.items() if v != "" and k not in ("health", "trace_ids", "eval_trace_id")}
        traces: dict[str, str | list[str]] = {}
        links = links_from(rd.read_config().traces, credentials_from_env())
        ids = row.get("trace_ids", "").split()
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
        from grpo_sentinel.telemetry.health.detectors import Thresholds, auto_window, diagnose
        from grpo_sentinel.telemetry.health.ingest import load
        from grpo_sentinel.telemetry.health.report import to_markdown, with_generations

        path = run_of(run_id).path
        if not (path / "steps.csv").is_file():
            raise HTTPException(404, f"run {run_id!r} has not recorded a step yet")
        runlog = load(path)
        th = Thresholds(window=runlog.window or auto_window(runlog.completions_per_step))
        return Response(to_markdown(with_generations(diagnose(runlog, th), runlog), runlog, th), media_type="text/markdown")

    return app


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


if __name__ == "__main__":  # docs/openapi.json, generated (a test keeps it equal)
    import json
    from pathlib import Path

    print(json.dumps(create_app(Supervisor(Path("unused")), None).openapi(), indent=2, sort_keys=True))
