"""What the tests share that is not a fixture: paths, the CLI command, ports, polling, a real Prometheus.
Fixtures live in conftest.py; tests import these from here."""
import contextlib
import csv
import dataclasses
import io
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from grpo_sentinel.telemetry.health.rules import RuleParams, render

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]


def new_run(parent: Path, cfg, name: str = "r"):
    """A fresh, locked run directory for a Trainer, as the CLI makes one."""
    from grpo_sentinel.service.runs import RunDir

    return RunDir.new(parent, name, cfg)


def cli(*args: str) -> list[str]:
    """Command line of the installed entry point, as a user runs it."""
    return [sys.executable, "-m", "grpo_sentinel.service.cli", *args]


@dataclasses.dataclass(frozen=True)
class Ran:
    """What a command did: subprocess.CompletedProcess's fields that the tests read."""

    returncode: int
    stdout: str
    stderr: str


def in_process(*args: str, cwd: Path | None = None, env: dict | None = None) -> Ran:
    """`grpo-sentinel ARGS` run by the same main() in this process, its stdout and stderr captured as a
    terminal would see them (the CLI's log lines included, in its format). For commands that end before
    any training (bad input, refused resumes): a subprocess would add only its interpreter's start-up
    (~5 s of imports on 2 cores). Environment, working directory, import path, signal handlers and
    logging are restored after."""
    from grpo_sentinel.service.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    saved = (dict(os.environ), os.getcwd(), list(sys.path), root.level,
             {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)})
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        sys.path[:0] = [p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's usage errors
                code = e.code if isinstance(e.code, int) else 2
    finally:
        root.removeHandler(handler)
        environ, wd, path, level, handlers = saved
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(wd)
        sys.path[:] = path
        root.setLevel(level)
        for s, h in handlers.items():
            signal.signal(s, h)
    return Ran(code, out.getvalue(), err.getvalue())


def installed(binary: str, package: str) -> str:
    """Path of a real component the tests run against: in CI its absence fails (.ci/run installs
    it), elsewhere it skips with the command that installs it."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{binary} is not installed (.ci/run installs Debian's {package})")
        pytest.skip(f"{binary} not installed: apt-get install {package}")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float = 300.0, every: float = 0.005) -> bool:
    """Poll until predicate() is true; False if `timeout` seconds pass first. Never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every)
    return False


def answers(url: str) -> bool:
    """True once a server answers `url` (a started process is not yet a listening one)."""
    try:
        urllib.request.urlopen(url)
        return True
    except OSError:
        return False


# The shipped rules with windows for the demo's pace (~5 steps a second, scraped every 200 ms): a
# 2 s window is ~10 steps, about the detectors' own window for the demo (7 steps).
FAST_RULES = RuleParams(window=2, pending=1)


@contextlib.contextmanager
def prometheus_server(folder: Path):
    """A real Prometheus on 127.0.0.1 with the alert rules, scraping every 200 ms; yields (query, target port,
    web port)."""
    binary = installed("prometheus", "prometheus")
    target, web = free_port(), free_port()
    rules = folder / "grpo-rules.yml"
    rules.write_text(render(FAST_RULES))
    (folder / "prometheus.yml").write_text(
        "global: {scrape_interval: 200ms, evaluation_interval: 200ms}\n"
        f"rule_files: ['{rules}']\n"
        f"scrape_configs: [{{job_name: grpo, static_configs: [{{targets: ['127.0.0.1:{target}']}}]}}]\n")
    proc = subprocess.Popen([binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(expr: str) -> list:
        url = f"http://127.0.0.1:{web}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        return json.load(urllib.request.urlopen(url))["data"]["result"]

    try:
        assert wait_for(lambda: answers(f"http://127.0.0.1:{web}/api/v1/query?query=up"), 30, 0.1), "prometheus did not start"
        # Its API answers seconds before its scrape loop starts (target discovery is batched every 5 s):
        # a run that short would never be scraped. The first `up` sample (0: nothing listens yet) says it has.
        assert wait_for(lambda: query('up{job="grpo"}'), 30, 0.1), "prometheus never scraped its target"
        yield query, target, web
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def query_range(web: int, expr: str, start: float, end: float) -> list:
    args = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 0.5})
    body = json.load(urllib.request.urlopen(f"http://127.0.0.1:{web}/api/v1/query_range?{args}"))
    assert body["status"] == "success", body
    return body["data"]["result"]


class Daemon:
    """`grpo-sentinel serve` as a real process on 127.0.0.1, its output in a log file beside the state dir."""

    def __init__(self, state: Path, *extra: str, env: dict | None = None, host: str = "127.0.0.1", port: int | None = None):
        self.port = port or free_port()
        self.listen = f"{host}:{self.port}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.state = state
        self.log = (state.parent / f"daemon-{self.port}.log").open("wb")
        self.proc = subprocess.Popen(cli("serve", "--listen", self.listen, "--state-dir", str(state), *extra),
                                     stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def ready(self) -> "Daemon":
        assert wait_for(lambda: answers(self.url + "/readyz") or self.proc.poll() is not None, 60, 0.05)
        assert self.proc.poll() is None, self.output()
        return self

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def call(self, method: str, path: str, body=None, token: str | None = None, raw: bytes | None = None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                text = r.read().decode()
                return r.status, (json.loads(text) if r.headers.get_content_type() == "application/json" else text)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode() or "{}")

    def run(self, run_id: str) -> dict:
        return self.call("GET", f"/v1/runs/{run_id}")[1]

    def wait_status(self, run_id: str, statuses: set[str], timeout: float = 600) -> dict:
        assert wait_for(lambda: self.run(run_id).get("status") in statuses, timeout, 0.2), (self.run(run_id), self.output())
        return self.run(run_id)

    def stop(self, sig=signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=120)


def steps_of(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open())) if path.is_file() else []
