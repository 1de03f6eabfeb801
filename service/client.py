"""`grpo-sentinel runs ...`: the daemon's API from the command line (standard library HTTP only).

A config is read with `train`'s own loader (the YAML file, then `--set`) and sent as it is: the daemon
validates and admits it (its paths and reward modules are the daemon's), and its message is `train`'s. Following a
run reads the daemon's event stream (`GET /v1/runs/{id}/events?follow=true`), reconnecting with the
last event's id when the daemon restarts, so no step is printed twice.

Every failure is one line on stderr and an exit code: 2 when what was asked is wrong (the token, the
run id, the config), 69 when the daemon cannot serve it now (unreachable, restarting, its disk full).
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

from grpo_sentinel.service.daemon import TOKEN_ENV
from grpo_sentinel.service.progress import Progress
from grpo_sentinel.service.runs import EXIT_CODES

log = logging.getLogger("grpo_sentinel")

URL_ENV = "GRPO_SENTINEL_URL"
DEFAULT_URL = "http://127.0.0.1:8000"  # `grpo-sentinel serve`'s default --listen
EXIT_BAD_INPUT, EXIT_UNAVAILABLE = 2, 69  # 69 = EX_UNAVAILABLE
# A followed run that ends `stopped` (through the API) or `removed` (stopped while queued) did not finish:
# 75, as `train` exits when a signal stops it (its checkpoint is kept).
FOLLOW_EXIT = {**EXIT_CODES, "removed": 75}
READ_TIMEOUT_S = 45  # the daemon sends a keep-alive every 15 s: three missed and the connection is dead


class ClientError(Exception):
    """What went wrong, in one line that says what to do, and the exit code."""

    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


class Unavailable(ClientError):
    def __init__(self, message: str):
        super().__init__(message, EXIT_UNAVAILABLE)


def failure(url: str, status: int, body: bytes) -> ClientError:
    """The daemon's error answer as one line and an exit code (the daemon says `message` for an invalid
    config, in `train`'s words, and `detail` otherwise)."""
    try:
        answer = json.loads(body)
    except ValueError:
        answer = {}
    said = (answer.get("message") or answer.get("detail")) if isinstance(answer, dict) else None
    said = said if isinstance(said, str) else ""  # a 422's `detail` is the list `message` says in words
    if status == 401:
        given = f"the token in {TOKEN_ENV} is not its token" if os.environ.get(TOKEN_ENV) else "no token was given"
        return ClientError(f"the daemon at {url} requires its API token, and {given}: set {TOKEN_ENV} to the "
                           "token the daemon was started with", EXIT_BAD_INPUT)
    if status == 404:
        hint = ": `grpo-sentinel runs list` shows its runs" if said.startswith("no run") else ""
        return ClientError(f"{said or 'not found'} (the daemon at {url}){hint}", EXIT_BAD_INPUT)
    if status == 409:  # a taken run id, or a resume of a run that has not failed
        hint = ": pick another run.run_id (e.g. --set run.run_id=NAME)" if "already exists" in said else ""
        return ClientError(f"{said or 'conflict'}{hint}", EXIT_BAD_INPUT)
    if status == 507:
        return Unavailable(f"the daemon at {url} {said or 'cannot write into its state directory'}: free space on "
                           "its state volume (or make it writable), then submit again; nothing was queued")
    if status == 500:
        return Unavailable(f"the daemon at {url} failed on this request (500 {said or 'Internal Server Error'}); "
                           "its log has the error")
    if status >= 500:
        return Unavailable(f"the daemon at {url} answered {status} ({said or 'unavailable'}): it may be starting or "
                           "shutting down; try again")
    return ClientError(said or f"the daemon at {url} refused the request ({status})", EXIT_BAD_INPUT)


@dataclass
class Message:
    """One server-sent event."""

    event: str
    data: dict
    id: str | None


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 30):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"--url {url!r}: expected the daemon's address, e.g. http://127.0.0.1:8000 "
                              f"(or set {URL_ENV})", EXIT_BAD_INPUT)
        self.url, self.token, self.timeout = url.rstrip("/"), token, timeout

    def _open(self, method: str, path: str, body: dict | None = None, headers: dict | None = None,
              timeout: float | None = None):
        data = None if body is None else json.dumps(body, default=str).encode()  # YAML dates stay text
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            **({"Content-Type": "application/json"} if data is not None else {}),
            **({"Authorization": f"Bearer {self.token}"} if self.token else {}), **(headers or {})})
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout)
        except urllib.error.HTTPError as e:
            with e:
                raise failure(self.url, e.code, e.read()) from None
        except (OSError, http.client.HTTPException) as e:  # refused, reset, DNS, timeout, not HTTP
            raise self._unreachable(e) from None

    def _unreachable(self, e: Exception) -> Unavailable:
        why = e.reason if isinstance(e, urllib.error.URLError) else e
        why = getattr(why, "strerror", None) or str(why) or type(why).__name__
        return Unavailable(f"cannot reach the daemon at {self.url} ({why}): is `grpo-sentinel serve` running there "
                           f"(and is it the address in --url / {URL_ENV})?")

    def text(self, method: str, path: str, body: dict | None = None) -> str:
        try:
            with self._open(method, path, body) as r:
                return r.read().decode()
        except (OSError, http.client.HTTPException) as e:  # the connection dropped mid-answer
            raise self._unreachable(e) from None

    def json(self, method: str, path: str, body: dict | None = None):
        text = self.text(method, path, body)
        try:
            return json.loads(text)
        except ValueError:
            raise Unavailable(f"the server at {self.url} did not answer as a grpo-sentinel daemon "
                              f"(not JSON: {text[:60]!r}); check --url / {URL_ENV}") from None

    def events(self, run_id: str, last_id: str | None) -> Iterator[Message]:
        """The run's event stream from after `last_id`, until the daemon ends it or the connection drops."""
        path = f"/v1/runs/{_quoted(run_id)}/events?follow=true"
        with self._open("GET", path, headers={"Accept": "text/event-stream",
                                              **({"Last-Event-ID": last_id} if last_id else {})},
                        timeout=READ_TIMEOUT_S) as r:
            event, data, eid = "message", [], None
            try:
                for raw in r:
                    line = raw.decode().rstrip("\r\n")
                    if line == "":  # a blank line ends an event
                        if data:
                            yield Message(event, json.loads("\n".join(data)), eid)
                        event, data = "message", []
                    elif not line.startswith(":"):  # ':' starts a keep-alive comment
                        field, _, value = line.partition(":")
                        value = value.removeprefix(" ")
                        if field == "event":
                            event = value
                        elif field == "data":
                            data.append(value)
                        elif field == "id":
                            eid = value
            except (OSError, ValueError, http.client.HTTPException):  # dropped (reset, timeout, a torn chunk):
                return  # the caller reconnects


# ---------------------------------------------------------------------------------------------------
# The commands: each returns its exit code.


def client_of(args) -> Client:
    return Client(args.url or os.environ.get(URL_ENV) or DEFAULT_URL, os.environ.get(TOKEN_ENV) or None)


def run(args) -> int:
    """`grpo-sentinel runs <command>`: its exit code, every failure one line on stderr."""
    from grpo_sentinel.service.config import ConfigError

    try:
        return COMMANDS[args.runs_command](client_of(args), args)
    except ConfigError as e:  # the config file or a --set, as `train` says it
        print(f"grpo-sentinel: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ClientError as e:
        print(f"grpo-sentinel: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:  # Ctrl-C while following: only this command ends
        print("\ngrpo-sentinel: interrupted; a run on the daemon goes on (`grpo-sentinel runs stop ID` stops it)",
              file=sys.stderr)
        return 130


def submit(client: Client, args) -> int:
    from grpo_sentinel.service.config import raw_config

    raw = raw_config(args.config, args.overrides)
    answer = client.json("POST", "/v1/runs", raw)
    print(answer["id"])  # alone on stdout: RUN=$(grpo-sentinel runs submit run.yaml)
    log.info("run %s %s on %s%s", answer["id"], answer["status"], client.url,
             "" if args.follow else f" (follow it: grpo-sentinel runs follow {answer['id']})")
    return follow_run(client, answer["id"], args.retry_s) if args.follow else 0


def list_runs(client: Client, args) -> int:
    runs = client.json("GET", "/v1/runs")
    if args.output == "json":
        print(json.dumps(runs, indent=2))
    else:
        print(table(["ID", "STATUS", "STEP"], [[r["id"], r["status"], f"{r['step']}/{r['steps']}"] for r in runs]))
    return 0


def show(client: Client, args) -> int:
    r = client.json("GET", f"/v1/runs/{_quoted(args.run_id)}")
    if args.output == "json":
        print(json.dumps(r, indent=2))
        return 0
    print(f"run {r['id']}: {r['status']} at step {r['step']}/{r['steps']}"
          + (f", attempt {r['attempt']}" if r.get("attempt") else "") + f" (submitted {r.get('submitted_at') or '?'})")
    if r.get("error"):
        print(f"error: {r['error']}")
    if r.get("baseline"):
        last = r.get("last_eval") or {}
        print("accuracy: " + ", ".join(f"{k} {_num(r['baseline'].get(k))} -> {_num(last.get(k))}"
                                       for k in ("sample_acc", "greedy_acc")) + f" (n={r['baseline'].get('n')})")
    m = r.get("metrics") or {}
    if m:
        print("latest step:\n" + table(["METRIC", "VALUE"], [[k, _num(m[k])] for k in SHOWN if k in m], indent="  "))
    print("conditions: " + ("none active" if not r.get("conditions") else ""))
    for c in r.get("conditions") or []:
        print(f"  {c['id']} ({c['severity']}): {c['cause']} Do: {c['action']}")
    traces = r.get("traces") or {}
    if traces.get("session"):
        print(f"traces: {traces['session']}")
    for e in (r.get("events") or [])[-5:]:
        print(f"  {e.get('time', '')} {describe(e)}")
    return 0


SHOWN = ("step", "reward", "kl", "loss", "entropy", "frac_zero_std", "train_acc", "response_len", "grad_norm",
         "step_time", "sample_acc")


def stop(client: Client, args) -> int:
    r = client.json("POST", f"/v1/runs/{_quoted(args.run_id)}/stop")
    said = {"stopping": "stopping: it checkpoints at its step boundary, then ends `stopped`",
            "removed": "removed from the queue (it had not started)"}
    print(f"run {r['id']}: {said.get(r['status'], 'already ' + r['status'] + '; nothing to stop')}")
    return 0


def resume(client: Client, args) -> int:
    r = client.json("POST", f"/v1/runs/{_quoted(args.run_id)}/resume")
    print(f"run {r['id']}: {r['status']} again; it continues from its newest checkpoint")
    return 0


def record(client: Client, args) -> int:
    sys.stdout.write(client.text("GET", f"/v1/runs/{_quoted(args.run_id)}/record?file={args.file}"))
    return 0


def report(client: Client, args) -> int:
    sys.stdout.write(client.text("GET", f"/v1/runs/{_quoted(args.run_id)}/report"))
    return 0


def follow(client: Client, args) -> int:
    return follow_run(client, args.run_id, args.retry_s)


COMMANDS = {"submit": submit, "list": list_runs, "show": show, "follow": follow, "stop": stop, "resume": resume,
            "record": record, "report": report}


# ---------------------------------------------------------------------------------------------------
# Following a run


def follow_run(client: Client, run_id: str, retry_s: float) -> int:
    """Print the run's progress as `train` does (its progress line, conditions as they begin, the final
    line) until it ends; the exit code of how it ended. A daemon that goes away is waited for `retry_s`
    seconds (a daemon never reached is an error at once: a wrong address, most likely); the stream
    resumes after the last event seen."""
    printer = Printer(run_id)
    last_id, lost, wait = None, None, 0.5
    while True:
        try:
            for msg in client.events(run_id, last_id):
                if lost is not None:
                    log.info("reconnected to the daemon at %s", client.url)
                lost, wait, last_id = None, 0.5, msg.id or last_id
                if msg.event == "end":
                    return printer.end(msg.data)
                printer.show(msg)
            why = "the daemon is shutting down" if printer.closing else "the connection to the daemon dropped"
        except Unavailable as e:
            if printer.status is None:
                raise
            why = str(e)
        if lost is None:
            lost = time.monotonic()
            log.warning("%s; reconnecting for up to %.0f s (--retry-s)", why, retry_s)
        elif time.monotonic() - lost > retry_s:
            raise Unavailable(f"{why}; gave up after {retry_s:.0f} s. The daemon resumes the run when it is back: "
                              f"follow it again with `grpo-sentinel runs follow {run_id}`")
        time.sleep(wait)
        wait = min(wait * 2, 5.0)


class Printer:
    """A followed run's events as `train` prints its own: the progress line (progress.Progress, fed the
    streamed rows), a line per event and per condition that begins, the final line and the exit code."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.progress = Progress(0)
        self.trained_s = 0.0  # the step times seen: the progress line's eta is from the run's pace, not ours
        self.status: str | None = None
        self.closing = False  # the daemon said it is shutting down

    def show(self, msg: Message) -> None:
        d = msg.data
        self.closing = msg.event == "closing"
        if msg.event == "status":  # the events say when it starts, resumes, is interrupted; the end has its line
            self.progress.total = d["steps"]
            if d["status"] == "queued" and self.status != "queued":
                log.info("run %s: queued, %d steps", self.run_id, d["steps"])
            self.status = d["status"]
        elif msg.event == "event" and d.get("event") != "created" and (
                d.get("event") != "ended" or d.get("status") == "preempted"):  # the final end has its own line
            log.info("run %s: %s", self.run_id, describe(d))
        elif msg.event == "step":
            self.trained_s += float(d.get("step_time", 0))
            self.progress.t0 = time.monotonic() - self.trained_s
            self.progress.on_step(stats_of(d))
        elif msg.event == "condition":
            log.warning("health: %s (%s) began at step %d: %s Do: %s", d["id"], d.get("severity", "?"), d["step"],
                        d.get("cause", ""), d.get("action", ""))

    def end(self, d: dict) -> int:
        self.progress.close()
        if d.get("reason"):
            print(f"grpo-sentinel: {d['reason']}", file=sys.stderr)
        if d["status"] == "removed":
            print(f"run {self.run_id} removed: it was stopped before it started")
        else:
            print(f"run {d['status']} at step {d['step']}: {self.run_id}")
        return FOLLOW_EXIT.get(d["status"], 1)


def describe(e: dict) -> str:
    """An events.jsonl entry as a line."""
    kind = e.get("event")
    if kind == "created":
        return f"created ({e.get('steps')} steps)"
    if kind == "started":
        return f"started (attempt {e.get('attempt')})"
    if kind == "resumed":
        return f"resumed from its checkpoint at step {e.get('step')} (attempt {e.get('attempt')})"
    if kind == "config_changed":
        return "config changed on resume: " + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in e.get("changes", {}).items())
    if kind == "ended":
        return f"ended {e.get('status')} at step {e.get('step')}" + (f": {e['reason']}" if e.get("reason") else "")
    return json.dumps(e)


def stats_of(row: dict):
    """A streamed steps.csv row as the StepStats the progress line reads (what the row lacks is NaN)."""
    from grpo_sentinel.telemetry.schema import Eval, StepStats

    known = {k: (row[k] if k == "skipped" else float(row[k])) for k in StepStats.scalar_fields()
             if k in row and k != "step"}
    ev = Eval(float(row["sample_acc"]), float(row["greedy_acc"]), int(row["eval_n"])) if "sample_acc" in row else None
    return StepStats.partial(int(row["step"]), eval=ev, **known)


# ---------------------------------------------------------------------------------------------------


def table(head: list[str], rows: list[list[str]], indent: str = "") -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
    return "\n".join(indent + "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip() for r in [head, *rows])


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else str(v)
    return "-" if v is None else str(v)


def _quoted(run_id: str) -> str:
    return urllib.parse.quote(run_id, safe="")

