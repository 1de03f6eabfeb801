"""The daemon against a hostile submitter and an unlucky operator, on real processes (loopback only):
user code that hangs, exits or snoops at import, a destructive callable, odd bodies, huge values,
a restart in the second after a run completes, a nearly full state volume, damaged files, a stop
in the first instant of a run. Each ends as the README's daemon section says."""

import errno
import http.client
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import Daemon, steps_of, wait_for

pytestmark = pytest.mark.slow  # the second tier (README, Tests)

TOKEN = "t0ken-of-the-daemon"
TINY = {"data": {"eval_size": 20}, "telemetry": {"prometheus": False}}


def tiny(run_id: str, steps: int = 2, **sections) -> dict:
    return {**TINY, "run": {"steps": steps, "run_id": run_id, "sample_every": steps}, **sections}


@pytest.fixture
def daemons(tmp_path):
    started = []

    def start(*extra, state: Path | None = None, **kw):
        d = Daemon(state or tmp_path / "state", *extra, **kw)
        started.append(d)
        return d.ready()
    yield start
    for d in started:
        d.stop(signal.SIGKILL)


def send(d: Daemon, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
         chunked: bool = False) -> tuple[int, dict]:
    """One raw request (any body, any headers), the answer as JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=30)
    try:
        conn.request(method, path, body=iter([body]) if chunked else body, headers=headers or {},
                     encode_chunked=chunked)
        r = conn.getresponse()
        text = r.read().decode()
        return r.status, json.loads(text) if text.startswith(("{", "[")) else {"text": text}
    finally:
        conn.close()


def post(d: Daemon, body: bytes, **headers) -> tuple[int, dict]:
    return send(d, "POST", "/v1/runs", body, {"Content-Type": "application/json", **headers})


def quick(d: Daemon, path: str = "/healthz") -> float:
    """Seconds a probe takes: the daemon's event loop is never held up."""
    t0 = time.monotonic()
    assert send(d, "GET", path)[0] == 200
    return time.monotonic() - t0


def test_user_code_runs_only_in_the_runs_process_and_only_if_the_operator_listed_it(daemons, tmp_path, demo_dir):
    mods = tmp_path / "mods"
    mods.mkdir()
    stamp = "import os, json, pathlib\npathlib.Path(os.environ['MARKS'], __name__).write_text(json.dumps(" \
            "{'pid': os.getpid(), 'cwd': os.getcwd(), 'env': sorted(os.environ)}))\n"
    (mods / "hangs.py").write_text(stamp + "import time\ntime.sleep(3600)\n")
    (mods / "leaves.py").write_text(stamp + "os._exit(1)\n")
    (mods / "snoops.py").write_text(stamp + "def reward(completion, answer, prompt):\n    return 0.0\n")
    (tmp_path / "marks").mkdir()
    d = daemons("--reward-module", "hangs", "--reward-module", "leaves", "--reward-module", "snoops",
                env={"PYTHONPATH": str(mods), "MARKS": str(tmp_path / "marks"), "GRPO_SENTINEL_API_TOKEN": TOKEN})
    auth = {"Authorization": f"Bearer {TOKEN}"}

    # Not listed: refused, naming the setting; a destructive stdlib callable is just another unlisted module.
    code, body = post(d, json.dumps(tiny("rm", rewards=[{"name": "correct"}, {"name": "shutil:rmtree", "weight": 0}])).encode(),
                      **auth)
    assert code == 422 and "rewards.1.name: 'shutil:rmtree' is not in a module this daemon runs" in body["message"]
    assert "serve --reward-module MODULE" in body["message"] and body["detail"][0]["type"] == "reward_not_allowed"

    # A module whose import hangs: the run's process hangs, the daemon answers and stops it.
    assert post(d, json.dumps(tiny("hang", rewards=[{"name": "hangs:f"}])).encode(), **auth)[0] == 201
    assert wait_for(lambda: (tmp_path / "marks" / "hangs").exists(), 120, 0.05)
    assert json.loads((tmp_path / "marks" / "hangs").read_text())["pid"] != d.proc.pid
    assert max(quick(d, "/healthz"), quick(d, "/readyz")) < 1.0
    assert send(d, "POST", "/v1/runs/hang/stop", headers=auth) == (200, {"id": "hang", "status": "stopping"})
    assert wait_for(lambda: send(d, "GET", "/v1/runs/hang", headers=auth)[1]["status"] == "stopped", 60, 0.1)

    # A module that kills its process at import: that run fails with the reason, the daemon goes on.
    assert post(d, json.dumps(tiny("leave", rewards=[{"name": "leaves:f"}])).encode(), **auth)[0] == 201
    assert wait_for(lambda: send(d, "GET", "/v1/runs/leave", headers=auth)[1]["status"] == "failed", 120, 0.1)
    assert send(d, "GET", "/v1/runs/leave", headers=auth)[1]["error"] == "the training process exited with code 1"
    assert d.proc.poll() is None

    # A module that reads the environment: no token there; it runs in the run's own directory.
    run = tiny("snoop", rewards=[{"name": "correct"}, {"name": "snoops:reward", "weight": 0}])
    assert post(d, json.dumps(run).encode(), **auth)[0] == 201
    assert wait_for(lambda: send(d, "GET", "/v1/runs/snoop", headers=auth)[1]["status"] == "completed", 300, 0.2)
    seen = json.loads((tmp_path / "marks" / "snoops").read_text())
    assert "GRPO_SENTINEL_API_TOKEN" not in seen["env"] and seen["pid"] != d.proc.pid
    assert seen["cwd"] == str((tmp_path / "state" / "runs" / "snoop").resolve())
    assert sorted(p.name for p in (tmp_path / "marks").iterdir()) == ["hangs", "leaves", "snoops"]  # none by the daemon
    t0 = time.monotonic()
    assert d.stop(signal.SIGTERM) == 0 and time.monotonic() - t0 < 10


def test_every_bad_body_is_a_4xx_that_says_what_to_fix(daemons, tmp_path, demo_dir):
    d = daemons()

    def refused(body: bytes, field: str, *words: str):
        code, answer = post(d, body)
        assert code == 422, (body[:200], code, answer)
        assert f"  - {field}:" in answer["message"] and all(w in answer["message"] for w in words), answer["message"]
        assert all(set(e) == {"loc", "msg", "type"} for e in answer["detail"])
        return answer

    refused(b'{"optim": {"lr": NaN}}', "optim.lr", "finite number")
    refused(b'{"grpo": {"beta": Infinity}}', "grpo.beta", "finite number")
    refused(b'{"grpo": {"beta": 1e400}}', "grpo.beta", "finite number")
    assert post(d, b'{"run": {"seed": 1' + b"0" * 5000 + b"}}")[0] == 400  # beyond Python's int parsing: not JSON here
    refused(b'{"run": {"seed": 1' + b"0" * 400 + b"}}", "run.seed", "less than 9223372036854775808")
    refused(b"{not json", "body", "not valid JSON")
    refused(b"[]", "(top level)")
    refused(b"null", "(top level)")
    refused(b'{"rewards": []}', "(top level)", "at least one reward function")
    refused(b'{"run": {"run_id": ".."}}', "run.run_id", "not '.' or '..'")
    refused(b'{"rewards": [{"name": "correct", "weight": NaN}]}', "rewards.0.weight")
    refused(b'{"optim": {"betas": [0.9, 1.5]}}', "optim.betas", "[0, 1)")
    refused(b'{"model": {"lora": {"target_modules": []}}}', "model.lora.target_modules")
    # Huge values are refused at once by the operator's limits, and nothing waits on them.
    t0 = time.monotonic()
    refused(b'{"grpo": {"prompts_per_step": 1000000000}, "distributed": {"nproc_per_node": 7}}', "(top level)",
            "cannot be split over 7 ranks", "(1, 2, 4, 5, 8")
    refused(b'{"grpo": {"prompts_per_step": 1000000000}, "distributed": {"nproc_per_node": 8}}',
            "grpo.prompts_per_step", "at most 1024 on this daemon", "limits.prompts_per_step")
    assert time.monotonic() - t0 < 2
    refused(b'{"grpo": {"group_size": 1000000000}}', "grpo.group_size", "at most 256")
    refused(b'{"model": {"lora": {"r": 1000000}}}', "model.lora.r", "limits.lora_r")
    refused(b'{"grpo": {"prompts_per_step": 8}, "distributed": {"nproc_per_node": 3}}', "(top level)",
            "use a world size that divides it (1, 2, 4, 8)")
    # Paths: only under the allowed roots (here the directory the daemon started in); nothing probed.
    answer = refused(json.dumps({"model": {"path": "/etc"}, "data": {"path": "/etc/passwd"}}).encode(), "model.path",
                     "outside the paths this daemon may read", "serve --allow-path DIR")
    assert "  - data.path:" in answer["message"] and "root:" not in answer["message"]
    # Not JSON, too large (announced or chunked): refused before anything parses it.
    assert send(d, "POST", "/v1/runs", b"{}", {"Content-Type": "text/plain"})[0] == 415
    assert send(d, "POST", "/v1/runs", b"{}")[0] == 415
    big = b'{"run": {"run_id": "' + b"x" * (2 << 20) + b'"}}'
    code, answer = post(d, big)
    assert code == 413 and "limits.body_bytes" in answer["detail"] and len(json.dumps(answer)) < 500
    assert send(d, "POST", "/v1/runs", big, {"Content-Type": "application/json"}, chunked=True)[0] == 413
    # A name that is not loopback (DNS rebinding from a web page) gets nothing from a tokenless daemon.
    assert send(d, "GET", "/v1/runs", headers={"Host": f"evil.example:{d.port}"})[0] == 421
    assert send(d, "GET", "/v1/runs", headers={"Host": f"localhost:{d.port}"})[0] == 200
    assert send(d, "GET", "/v1/runs")[1] == []  # nothing was queued by any of it
    assert quick(d) < 1.0


def test_a_restart_right_after_a_run_completes_never_trains_it_again(daemons, tmp_path, demo_dir):
    d = daemons()
    assert post(d, json.dumps(tiny("done", steps=4, run={"steps": 4, "run_id": "done", "sample_every": 4,
                                                         "checkpoint_every": 2})).encode())[0] == 201
    summary = tmp_path / "state" / "runs" / "done" / "summary.json"

    def completed() -> bool:
        try:
            return json.loads(summary.read_text()).get("status") == "completed"
        except (OSError, ValueError):
            return False
    assert wait_for(completed, 300, 0.002)
    d.proc.send_signal(signal.SIGTERM)  # a rolling update, in the second the run's process takes to exit
    assert d.proc.wait(timeout=60) == 0
    assert json.loads(summary.read_text())["status"] == "completed"
    # The state an older daemon left behind in that moment: the run marked preempted at its last step.
    record = json.loads(summary.read_text())
    summary.write_text(json.dumps({**record, "status": "preempted"}))
    d = daemons()
    assert wait_for(lambda: send(d, "GET", "/v1/runs/done")[1]["status"] == "completed", 120, 0.1)
    run_dir = tmp_path / "state" / "runs" / "done"
    assert [r["step"] for r in steps_of(run_dir / "steps.csv")] == ["1", "2", "3", "4"]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")) == ["step-00000002", "step-00000004"]


def tmpfs(path: Path, size: str) -> None:
    path.mkdir(parents=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")


def fill(volume: Path, leave: int) -> Path:
    """A file that leaves `leave` bytes free on the volume (0: every byte taken, whatever else writes)."""
    filler = volume / "filler"
    free = os.statvfs(volume).f_bavail * os.statvfs(volume).f_frsize
    with filler.open("ab", buffering=0) as f:
        try:
            f.write(b"\0" * max(0, free - leave))
            while not leave:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC and not leave, e
    return filler


def test_a_nearly_full_state_volume_queues_a_run_wholly_or_not_at_all(daemons, tmp_path, demo_dir):
    volume = tmp_path / "vol" / "state"  # the state directory is the volume (the daemon's log lies beside it)
    tmpfs(volume, "4m")
    try:
        (tmp_path / "mods").mkdir()
        (tmp_path / "mods" / "hangs.py").write_text("import time\ntime.sleep(3600)\n")
        d = daemons("--reward-module", "hangs", state=volume, env={"PYTHONPATH": str(tmp_path / "mods")})
        # The worker is busy with a run that never starts training: every later submission stays queued.
        assert post(d, json.dumps(tiny("busy", rewards=[{"name": "hangs:f"}])).encode())[0] == 201
        answered = {}
        for pages in range(8):  # from no room at all to enough: every way a submission's writes can fail
            filler = fill(volume, pages * 4096)
            run_id = f"r{pages}"
            code, body = post(d, json.dumps(tiny(run_id)).encode())
            assert code in (201, 507), body
            answered[run_id] = code
            on_disk = (volume / "runs" / run_id).exists()
            queue = json.loads((volume / "queue.json").read_text())["order"]
            assert on_disk == (code == 201) == (run_id in queue), (pages, code, on_disk, queue)
            if code == 507:
                assert "nothing was queued" in body["detail"]
            filler.unlink()
        assert 507 in answered.values() and 201 in answered.values(), answered
        retry = next(r for r, c in answered.items() if c == 507)
        assert post(d, json.dumps(tiny(retry)).encode())[0] == 201  # a client's retry makes one run, not two
        listed = [r["id"] for r in send(d, "GET", "/v1/runs")[1]]
        assert listed == ["busy", *[r for r, c in answered.items() if c == 201], retry]
        d.stop(signal.SIGKILL)
        d = daemons(state=volume)  # the next start knows exactly these runs
        assert [r["id"] for r in send(d, "GET", "/v1/runs")[1]] == listed
        d.stop(signal.SIGKILL)
    finally:
        subprocess.run(["umount", "-l", str(volume)])


def test_a_run_that_failed_on_a_full_disk_resumes_through_the_api(daemons, tmp_path, demo_dir):
    volume = tmp_path / "vol" / "state"
    tmpfs(volume, "16m")
    try:
        d = daemons(state=volume)
        run = tiny("full", steps=40, run={"steps": 40, "run_id": "full", "sample_every": 40, "checkpoint_every": 1})
        assert post(d, json.dumps(run).encode())[0] == 201
        record = volume / "runs" / "full" / "steps.csv"
        assert wait_for(lambda: len(steps_of(record)) >= 3, 300, 0.05)
        filler = fill(volume, 0)
        d.wait_status("full", {"failed"})  # the run's own reason first, then the daemon's advice once its process ended
        assert wait_for(lambda: "POST /v1/runs/full/resume" in (d.run("full")["error"] or ""), 60, 0.1), d.run("full")
        assert "disk under the run is full" in d.run("full")["error"]
        filler.unlink()
        assert send(d, "POST", "/v1/runs/full/resume") == (200, {"id": "full", "status": "queued"})
        done = d.wait_status("full", {"completed"})
        assert done["step"] == 40 and [r["step"] for r in steps_of(record)] == [str(s) for s in range(1, 41)]
        assert send(d, "POST", "/v1/runs/full/resume")[0] == 409  # only a failed run resumes
    finally:
        subprocess.run(["umount", "-l", str(volume)])


def test_damaged_files_spoil_one_run_only_and_an_early_stop_is_a_stop(daemons, tmp_path, demo_dir):
    data = tmp_path / "data" / "add.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(10, 40) for b in range(10, 20)))
    d = daemons("--allow-path", str(tmp_path), "--allow-path", str(demo_dir.parent))
    assert post(d, json.dumps(tiny("a")).encode())[0] == 201
    own = tiny("b", steps=6, model={"path": str(demo_dir)}, data={"path": str(data), "eval_size": 20},
               telemetry={"linger_s": 2})
    assert post(d, json.dumps(own).encode())[0] == 201
    # The open /metrics names the model, not its path on the node.
    assert wait_for(lambda: 'run_id="b"' in send(d, "GET", "/metrics")[1]["text"], 300, 0.05)
    metrics = send(d, "GET", "/metrics")[1]["text"]
    assert f'grpo_model="{demo_dir.name}"' in metrics and str(demo_dir) not in metrics
    d.wait_status("b", {"completed"})
    runs = tmp_path / "state" / "runs"
    (runs / "a" / "summary.json").write_text("")  # a crash of the disk, not of ours
    with (runs / "b" / "events.jsonl").open("a") as f:
        f.write('{"event": "ha')  # a torn append
    shutil.move(data, tmp_path / "moved.jsonl")  # the finished run's dataset is gone
    assert send(d, "GET", "/v1/runs")[1] == [{"id": "a", "status": "damaged", "step": 0, "steps": 0},
                                             {"id": "b", "status": "completed", "step": 6, "steps": 6}]
    code, a = send(d, "GET", "/v1/runs/a")
    assert code == 200 and a["status"] == "damaged" and "summary.json" in a["error"]
    code, b = send(d, "GET", "/v1/runs/b")
    assert code == 200 and b["events"][-1]["event"] == "unreadable" and b["metrics"]["step"] == 6
    # A stop in the first instant of a run, before its process can even take signals: it is stopped.
    for n, delay in enumerate((0.0, 0.02, 0.1, 0.3, 1.0)):
        assert post(d, json.dumps(tiny(f"s{n}", steps=50)).encode())[0] == 201
        time.sleep(delay)  # the point of the case: a stop at several moments of the start
        answer = send(d, "POST", f"/v1/runs/s{n}/stop")[1]["status"]
        if answer == "removed":  # still queued: gone
            assert not (runs / f"s{n}").exists()
        else:
            assert answer == "stopping"
            assert d.wait_status(f"s{n}", {"stopped", "failed", "preempted", "completed"})["status"] == "stopped"


def test_the_operators_settings_are_checked_before_the_daemon_starts(tmp_path):
    from helpers import cli

    def serve(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run(cli("serve", "--state-dir", str(tmp_path / "s"), *flags), capture_output=True, text=True,
                              timeout=60)

    bad = serve("--limit", "group_size=many", "--limit", "group_sise=4", "--limit", "lora_r")
    assert bad.returncode == 2 and "--limit 'lora_r': expected NAME=N" in bad.stderr
    bad = serve("--limit", "group_size=many", "--limit", "group_sise=4")
    assert bad.returncode == 2 and "limits.group_size:" in bad.stderr
    assert "limits.group_sise: unknown key (did you mean 'group_size'?)" in bad.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was made
