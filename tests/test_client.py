"""`grpo-sentinel runs ...` against a real daemon (real processes, tiny demo runs), and the event stream
it follows: its cursor across a resume that rewrites steps.csv, a reconnect, a daemon restart."""

import csv
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import Daemon, cli, steps_of, wait_for

pytestmark = pytest.mark.slow  # the second tier (README, Tests)

# A demo run small enough to be quick on a loaded 2-core machine: 2 prompts x 4 completions a step.
TINY = {"grpo": {"group_size": 4, "prompts_per_step": 2}, "data": {"eval_size": 8},
        "run": {"sample_every": 2, "checkpoint_every": 2, "eval_seed": 7}, "telemetry": {"prometheus": False}}
STEP_LINE = re.compile(r" INFO step (\d+)/(\d+) reward (\S+) kl (\S+) loss (\S+) entropy (\S+)")


def tiny(run_id: str, steps: int) -> dict:
    return {**TINY, "run": {**TINY["run"], "run_id": run_id, "steps": steps}}


def runs(d: Daemon | None, *args: str, token: str | None = None, url: str | None = None, timeout: float = 600):
    env = {k: v for k, v in os.environ.items() if k != "GRPO_SENTINEL_API_TOKEN"}
    env.update({"GRPO_SENTINEL_URL": url or d.url, **({"GRPO_SENTINEL_API_TOKEN": token} if token else {})})
    return subprocess.run(cli("runs", *args), capture_output=True, text=True, timeout=timeout, env=env)


def follower(d: Daemon, run_id: str, log: Path) -> subprocess.Popen:
    """`runs follow` in its own process, its stderr (the progress lines) in `log`."""
    return subprocess.Popen(cli("runs", "follow", run_id, "--retry-s", "300"), stdout=subprocess.PIPE,
                            stderr=log.open("w"), text=True, env={**os.environ, "GRPO_SENTINEL_URL": d.url})


def printed(err: str) -> list[tuple]:
    """(step, reward, kl, loss, entropy) of each progress line printed."""
    return [(int(m[1]), m[3], m[4], m[5], m[6]) for m in STEP_LINE.finditer(err)]


def as_printed(rows: list[dict]) -> list[tuple]:
    """The record's rows as the progress line prints them (train's format: progress.Progress)."""
    def kl(v):
        return "-" if v == "" else f"{float(v):.4f}"
    return [(int(r["step"]), f"{float(r['reward']):.3f}", kl(r["kl"]), f"{float(r['loss']):+.4f}",
             f"{float(r['entropy']):.3f}") for r in rows]


def one_line(p: subprocess.CompletedProcess) -> str:
    """A failure's whole output: one line on stderr, nothing on stdout, no traceback."""
    assert p.stdout == "" and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    return p.stderr.strip()


def test_submit_a_yaml_with_set_follow_it_to_the_end_and_read_it_back(daemons, tmp_path, demo_dir):
    d = daemons().ready()
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps(tiny("y", 3)))  # YAML (JSON is YAML): steps 3, changed to 4 by --set
    p = runs(d, "submit", str(cfg), "--set", "run.steps=4", "--set", "grpo.beta=0.02", "--follow")
    assert p.returncode == 0, p.stderr
    out = p.stdout.splitlines()
    assert out[0] == "y" and out[-1] == "run completed at step 4: y"  # the id alone first, for scripts
    record = steps_of(d.state / "runs" / "y" / "steps.csv")
    assert [r["step"] for r in record] == ["1", "2", "3", "4"]
    assert printed(p.stderr) == as_printed(record)  # every step once, as the record has it
    saved = (d.state / "runs" / "y" / "config.yaml").read_text()
    assert "beta: 0.02" in saved and "group_size: 4" in saved  # the YAML and the --set both reached the daemon
    assert " step 2/4 " in p.stderr and "| sample_acc" in p.stderr and "run y: started (attempt 1)" in p.stderr

    # Read back: the same answers as the API's, tables for people.
    listed = runs(d, "list", "--output", "json")
    assert json.loads(listed.stdout) == d.call("GET", "/v1/runs")[1]
    assert runs(d, "list").stdout.split() == ["ID", "STATUS", "STEP", "y", "completed", "4/4"]
    shown = json.loads(runs(d, "show", "y", "--output", "json").stdout)
    assert shown["status"] == "completed" and shown["step"] == 4 and shown["baseline"]["n"] == 8
    human = runs(d, "show", "y").stdout
    assert human.startswith("run y: completed at step 4/4, attempt 1") and "conditions: none active" in human
    assert runs(d, "record", "y").stdout == (d.state / "runs" / "y" / "steps.csv").read_text()
    curve = runs(d, "record", "y", "--file", "reward-vs-step").stdout
    assert [r["step"] for r in csv.DictReader(curve.splitlines())] == ["0", "2", "4"]
    assert runs(d, "report", "y").stdout.startswith("# Monitoring report")
    # Following a run that has ended replays it and exits with its code at once.
    again = runs(d, "follow", "y")
    assert again.returncode == 0 and printed(again.stderr) == as_printed(record)

    # The stream itself: resumable from any event's id, and the remainder is what followed that event.
    events = sse(d.url + "/v1/runs/y/events")
    kinds = [e["event"] for e in events]
    assert kinds[-1] == "end" and kinds.count("step") == 4 and kinds.count("event") == 3  # created, started, ended
    assert [e["data"]["event"] for e in events if e["event"] == "event"] == ["created", "started", "ended"]
    middle = next(i for i, e in enumerate(events) if e["event"] == "step" and e["data"]["step"] == 2)
    rest = sse(d.url + "/v1/runs/y/events", last_id=events[middle]["id"])
    assert [(e["event"], e["data"]) for e in rest if e["event"] != "status"] == \
        [(e["event"], e["data"]) for e in events[middle + 1:] if e["event"] != "status"]
    bad = urllib.request.Request(d.url + "/v1/runs/y/events", headers={"Last-Event-ID": "soon"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(bad)
    assert e.value.code == 400 and "STEP-EVENTS" in json.load(e.value)["detail"]


def sse(url: str, last_id: str | None = None) -> list[dict]:
    """The server-sent events of a stream that ends, as {event, data, id}."""
    req = urllib.request.Request(url, headers={"Last-Event-ID": last_id} if last_id else {})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.headers.get_content_type() == "text/event-stream"
        blocks = r.read().decode().split("\n\n")
    out = []
    for block in blocks:
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if "event" in fields:
            out.append({"event": fields["event"], "data": json.loads(fields["data"]), "id": fields["id"]})
    return out


def test_stop_from_another_process_while_following_and_streams_never_hold_up_the_probes(daemons, tmp_path, demo_dir):
    d = daemons().ready()
    assert d.call("POST", "/v1/runs", tiny("long", 200))[0] == 201
    f = follower(d, "long", tmp_path / "follow.err")
    record = d.state / "runs" / "long" / "steps.csv"
    assert wait_for(lambda: len(printed((tmp_path / "follow.err").read_text())) >= 2, 600, 0.1)
    # More followers than the server has worker threads (40), of a queued run (nothing to send for a
    # while): a stream that held a thread while it waited would starve the probes and every endpoint.
    assert d.call("POST", "/v1/runs", tiny("later", 1))[0] == 201
    streams = [urllib.request.urlopen(d.url + "/v1/runs/later/events?follow=true", timeout=60) for _ in range(48)]
    try:
        for s in streams:
            assert s.readline().startswith(b"event: status")
        t0 = time.monotonic()
        assert answers_within(d.url + "/readyz", 10) and answers_within(d.url + "/v1/runs", 10)
        assert time.monotonic() - t0 < 10
    finally:
        for s in streams:
            s.close()
    assert runs(d, "stop", "later").stdout.strip() == "run later: removed from the queue (it had not started)"
    stopped = runs(d, "stop", "long")
    assert stopped.returncode == 0 and stopped.stdout.startswith("run long: stopping")
    out, _ = f.communicate(timeout=600)
    err = (tmp_path / "follow.err").read_text()
    rows = steps_of(record)
    assert f.returncode == 75, err  # stopped before it finished, as `train` exits when a signal stops it
    assert out.strip() == f"run stopped at step {len(rows)}: long" and "Traceback" not in err
    assert printed(err) == as_printed(rows) and "grpo-sentinel: stopped through the API" in err
    assert runs(d, "stop", "long").stdout.strip() == "run long: already stopped; nothing to stop"


def answers_within(url: str, seconds: float) -> bool:
    with urllib.request.urlopen(url, timeout=seconds) as r:
        return r.status == 200


def test_the_daemon_restarted_twice_while_following_and_no_step_is_printed_twice(daemons, tmp_path, demo_dir):
    d = daemons("--grace-s", "20").ready()
    port = d.port
    # Long enough that the SIGTERM below lands well before the last step (10 steps took 0.5 s in CI and
    # once finished before the signal: nothing was left to resume).
    d.call("POST", "/v1/runs", tiny("r", 100))
    f = follower(d, "r", tmp_path / "follow.err")
    record = d.state / "runs" / "r" / "steps.csv"
    err = lambda: (tmp_path / "follow.err").read_text()  # noqa: E731
    assert wait_for(lambda: len(printed(err())) >= 3, 600, 0.05)
    # SIGTERM: the run checkpoints; the daemon ends the streams first, so its shutdown is not held up.
    assert d.stop(signal.SIGTERM) == 0
    assert "timeout graceful shutdown exceeded" not in d.output()
    assert wait_for(lambda: "the daemon is shutting down; reconnecting" in err(), 30, 0.05), err()
    assert f.poll() is None
    d = daemons(port=port).ready()  # the same address: the follower reconnects, the run resumes
    seen = len(printed(err()))
    assert wait_for(lambda: len(printed(err())) >= seen + 2 or f.poll() is not None, 600, 0.02)
    if f.poll() is None:
        d.stop(signal.SIGKILL)  # the pod dies: rows past the checkpoint are dropped and redone after the restart
        d = daemons(port=port).ready()
    out, _ = f.communicate(timeout=600)
    assert f.returncode == 0, err()
    assert out.strip() == "run completed at step 100: r"
    assert printed(err()) == as_printed(steps_of(record))  # 1..100, each once, as recorded
    assert err().count("reconnected to the daemon") >= 1 and "resumed from its checkpoint" in err()


def test_a_wrong_token_bad_input_and_an_unreachable_daemon_are_one_line_each(daemons, tmp_path, demo_dir):
    d = daemons(env={"GRPO_SENTINEL_API_TOKEN": "s3cret"}).ready()
    p = runs(d, "list", token="guess-1")
    assert p.returncode == 2 and "the token in GRPO_SENTINEL_API_TOKEN is not its token" in one_line(p)
    assert "guess-1" not in p.stderr  # a token is never printed
    assert "no token was given" in one_line(runs(d, "list"))
    assert runs(d, "list", token="s3cret").stdout.split() == ["ID", "STATUS", "STEP"]
    # 404, 409, 422: bad input (2), in words that say what to do.
    p = runs(d, "show", "nope", token="s3cret")
    assert p.returncode == 2 and "no run 'nope'" in one_line(p) and "runs list" in p.stderr
    assert runs(d, "follow", "nope", token="s3cret").returncode == 2
    cfg = tmp_path / "run.yaml"
    cfg.write_text("run: {steps: 1, run_id: once}\ndata: {eval_size: 8}\ngrpo: {group_size: 4, prompts_per_step: 2}\n")
    assert runs(d, "submit", str(cfg), token="s3cret").stdout == "once\n"
    p = runs(d, "submit", str(cfg), token="s3cret")
    assert p.returncode == 2 and "run 'once' already exists: pick another run.run_id" in one_line(p)
    # An invalid config: the daemon's message is `train`'s, word for word.
    cfg.write_text("grpo: {group_sise: 8}\noptim: {lr: fast}\n")
    submitted = runs(d, "submit", str(cfg), "--set", "run.steps=0", token="s3cret")
    trained = subprocess.run(cli("train", "--config", str(cfg), "--set", "run.steps=0"), capture_output=True, text=True)
    assert submitted.returncode == trained.returncode == 2
    assert submitted.stderr == trained.stderr and "did you mean 'group_size'" in submitted.stderr
    (tmp_path / "broken.yaml").write_text("run: [\n")
    p = runs(d, "submit", str(tmp_path / "broken.yaml"), token="s3cret")
    assert p.returncode == 2 and "is not valid YAML" in p.stderr and "Traceback" not in p.stderr
    # Unreachable: 69, with what to check.
    d.stop(signal.SIGKILL)
    p = runs(None, "list", url=d.url, token="s3cret")
    assert p.returncode == 69 and "cannot reach the daemon at " + d.url in one_line(p)
    p = runs(None, "follow", "once", url=d.url, token="s3cret")  # never reached: at once, not after --retry-s
    assert p.returncode == 69 and "cannot reach the daemon" in one_line(p)
    p = runs(None, "list", url="localhost:8000")
    assert p.returncode == 2 and "expected the daemon's address" in one_line(p)
    assert "s3cret" not in d.output()


@pytest.mark.parametrize("status, body, code, says", [
    (507, b'{"detail": "cannot write the run into the state directory: No space left on device"}', 69,
     "free space on its state volume"),
    (503, b"<html>Service Unavailable</html>", 69, "answered 503"),
    (500, b"Internal Server Error", 69, "its log has the error"),
    (422, b'{"message": "invalid config (1 problem):\\n  - run.steps: bad", "detail": []}', 2, "run.steps: bad"),
    (400, b'{"detail": "Last-Event-ID \'x\' is not an id this stream sent"}', 2, "Last-Event-ID"),
])
def test_each_error_answer_is_a_message_and_an_exit_code(status, body, code, says):
    from grpo_sentinel.service.client import failure

    e = failure("http://d:8000", status, body)
    assert e.code == code and says in str(e)


def test_the_stream_resumes_after_its_cursor_across_a_resume_that_rewrites_the_record(tmp_path):
    """The files as a run writes them: a torn last row, then a resume that rewrites steps.csv without the
    rows past its checkpoint and redoes them; a follower, live or reconnecting, is sent each step once."""
    from grpo_sentinel.service.daemon.follow import Cursor, RunTail

    def rows(*steps: tuple) -> str:
        return "".join(f"{s},{r},{h}\n" for s, r, h in steps)

    (tmp_path / "summary.json").write_text('{"status": "running", "step": 0, "steps": 6, "attempt": 1}')
    (tmp_path / "events.jsonl").write_text('{"event": "created"}\n{"event": "started", "step": 0}\n')
    steps = tmp_path / "steps.csv"
    steps.write_text("step,reward,health\n" + rows((1, 0.1, ""), (2, 0.2, "kl_spike"), (3, 0.3, "kl_spike")) + "4,0.")
    tail = RunTail(tmp_path)
    got, summary = tail.poll()
    assert summary["status"] == "running"
    assert [(k, d.get("step"), d.get("event") or d.get("id")) for k, d, _ in got] == [
        ("status", 0, None), ("event", None, "created"), ("event", 0, "started"), ("step", "1", None),
        ("step", "2", None), ("condition", 2, "kl_spike"), ("step", "3", None)]  # a condition once, where it begins
    assert str(tail.cursor) == "3-2" and got[-1][2] == tail.cursor
    with steps.open("a") as f:
        f.write("4,\n")  # the torn row ends: 4,0.4,
    assert [(k, d["step"]) for k, d, _ in tail.poll()[0]] == [("step", "4")]
    # A resume from the checkpoint at step 2: the record is rewritten through step 2, then steps 3... redone.
    tmp = tmp_path / "steps.tmp"
    tmp.write_text("step,reward,health\n" + rows((1, 0.1, ""), (2, 0.2, "kl_spike")))
    tmp.replace(steps)
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write('{"event": "resumed", "step": 2}\n')
    assert [(k, d.get("event")) for k, d, _ in tail.poll()[0]] == [("event", "resumed")]
    with steps.open("a") as f:
        f.write(rows((3, 0.3, "kl_spike"), (4, 0.4, ""), (5, 0.5, "kl_spike")))
    got = tail.poll()[0]
    assert [(k, d["step"]) for k, d, _ in got] == [("step", "5"), ("condition", 5)]  # 3, 4 were sent
    # A follower that reconnects with the last id it saw is sent nothing it saw.
    again = RunTail(tmp_path, Cursor.parse(str(got[-1][2])))
    assert [k for k, _, _ in again.poll()[0]] == ["status"]
    # A summary caught mid-write reads again next time; one unreadable twice running is a damaged run.
    (tmp_path / "summary.json").write_text('{"status": "comp')
    assert again.poll()[1]["status"] == "running"
    damaged = again.poll()[1]
    assert damaged["status"] == "damaged" and "is corrupt" in damaged["reason"]
    assert Cursor.parse("12-3") == Cursor(12, 3) and str(Cursor(12, 3)) == "12-3"
    with pytest.raises(ValueError, match="STEP-EVENTS"):
        Cursor.parse("12")
