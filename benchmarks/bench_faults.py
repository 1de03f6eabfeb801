"""Faults against the daemon: SIGKILL it at random moments of a run, again and again (each time the
whole "pod" dies: the training process with it), restart it, and check the run record at the end
against an uninterrupted run of the same config: steps lost, steps duplicated, values that differ.
Then SIGTERM during a run: the time to exit and whether the run's checkpoint is at its last step.

    python benchmarks/bench_faults.py [--kills 20] [--steps 60]
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CLI = [sys.executable, "-m", "grpo_sentinel.service.cli"]
KEYS = ("reward", "kl", "loss", "sample_acc")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(path: Path) -> list[dict]:
    try:
        return list(csv.DictReader(path.open()))
    except FileNotFoundError:
        return []


def daemon(state: Path, port: int) -> subprocess.Popen:
    p = subprocess.Popen([*CLI, "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz")
            return p
        except OSError:
            time.sleep(0.05)
    raise SystemExit("the daemon did not become ready")


def status(port: int, run_id: str) -> dict:
    return json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/runs/{run_id}"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    run_cfg = {"run": {"steps": args.steps, "sample_every": 10, "checkpoint_every": 3, "eval_seed": 7, "run_id": "r"},
               "data": {"eval_size": 40}}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        flags = [x for k, v in {"run.steps": args.steps, "run.sample_every": 10, "run.checkpoint_every": 3,
                                "run.eval_seed": 7, "data.eval_size": 40, "telemetry.prometheus": "false"}.items()
                 for x in ("--set", f"{k}={v}")]
        subprocess.run([*CLI, "train", "--out", str(tmp / "ref"), "--set", "run.run_id=r", *flags], check=True,
                       capture_output=True)
        state, port, rng = tmp / "state", free_port(), random.Random()
        d = daemon(state, port)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/runs", data=json.dumps(run_cfg).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req)
        record = state / "runs" / "r" / "steps.csv"
        kills = 0
        while kills < args.kills:
            done = len(rows(record))
            if done >= args.steps - 1:
                break
            # a random moment: within the next few steps, or while the model loads (target 0)
            target = done + rng.randint(0, 3)
            while len(rows(record)) < target and d.poll() is None:
                time.sleep(0.01)
            time.sleep(rng.uniform(0, 0.3))
            d.kill()
            d.wait()
            kills += 1
            print(f"  kill {kills}: at {len(rows(record))} recorded steps", flush=True)
            d = daemon(state, port)
        while status(port, "r")["status"] not in ("completed", "failed"):
            time.sleep(0.2)
        final = status(port, "r")
        d.kill()
        d.wait()
        got, want = rows(record), rows(tmp / "ref" / "r" / "steps.csv")
        steps = [int(r["step"]) for r in got]
        lost = sorted(set(range(1, args.steps + 1)) - set(steps))
        duplicated = len(steps) - len(set(steps))
        differ = sum(any(a[k] != b[k] for k in KEYS) for a, b in zip(got, want))
        print(f"SIGKILL x{kills} during one {args.steps}-step run (attempts {final['attempt']}): status {final['status']}, "
              f"steps lost {len(lost)}, duplicated {duplicated}, rows whose {'/'.join(KEYS)} differ from an "
              f"uninterrupted run: {differ}")
        # SIGTERM: checkpoint at the step boundary and exit 0 within the grace.
        d = daemon(tmp / "state2", port)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/runs",
                                     data=json.dumps({**run_cfg, "run": {**run_cfg["run"], "steps": 10_000}}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(req)
        record = tmp / "state2" / "runs" / "r" / "steps.csv"
        while len(rows(record)) < 5:
            time.sleep(0.05)
        t0 = time.monotonic()
        d.send_signal(signal.SIGTERM)
        code = d.wait()
        took = time.monotonic() - t0
        summary = json.loads((tmp / "state2" / "runs" / "r" / "summary.json").read_text())
        at_step = (tmp / "state2" / "runs" / "r" / "checkpoints" / f"step-{len(rows(record)):08d}").is_dir()
        print(f"SIGTERM: exit {code} after {took:.1f} s (grace 30 s); run {summary['status']} at step "
              f"{summary['step']} of {len(rows(record))} recorded, checkpoint at that step: {at_step}")


if __name__ == "__main__":
    main()
