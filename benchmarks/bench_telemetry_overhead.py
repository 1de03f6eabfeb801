"""What does telemetry cost a training step, with its defaults? The demo's full trainer loop (GRPO step,
held-out evaluation every `run.sample_every` steps, health monitor, run record) with telemetry off, and
with the sinks `grpo-sentinel train` builds from the default config: the Prometheus reader, OTLP/HTTP
pushes every 10 s to a live receiver, Langfuse traces of every 5th step's groups and of every held-out
round to a live receiver; then the same with nothing listening at either endpoint; and metrics or traces alone.

The mean step time, not the median: periodic costs (an export, a held-out round's traces) land on a
few steps, and a median hides them. The run's total wall time (open to close, the sinks' final flush
included) is the other figure, and the CPU time of the process's other threads over the steps (the
sinks' workers and exporters: what telemetry adds off the training thread, measured directly, so it moves
far less with the machine's load than a difference of two step times). Variants run interleaved, each in
a fresh process, `--repeats` times; each figure is the median over the processes of that process's mean
(or total). The receivers run in this (otherwise idle) parent process, like a collector and a Langfuse
elsewhere on the network.

    python benchmarks/bench_telemetry_overhead.py [--repeats 3] [--steps 60] [--threads N] [--clock cpu]

On a machine others are using, `--threads 1 --clock cpu` moves far less: the process's CPU time, which
counts the exporters' and Langfuse's worker threads too (the work telemetry adds), but not time spent
waiting on a dead endpoint (the total's wall clock, printed beside it, does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# variant -> (metrics, traces): each as `grpo-sentinel train` sets it up from the default config
VARIANTS = {"off": (False, False), "defaults": (True, True), "defaults_dead": (True, True),
            "metrics": (True, False), "traces": (False, True)}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def other_threads_cpu() -> float:
    """CPU seconds of this process's threads but the calling one, alive now (Linux: /proc utime + stime)."""
    me, total = threading.get_native_id(), 0
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) != me:
            with contextlib.suppress(OSError):  # a thread that just ended
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime: stat's 14th and 15th fields
    return total / os.sysconf("SC_CLK_TCK")


def machine() -> str:
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} CPUs; Python {platform.python_version()}, torch {torch.__version__}"


def worker(variant: str, steps: int, port: int, clock) -> dict:
    from grpo_sentinel.service.cli import telemetry_sinks
    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.runs import RunDir
    from grpo_sentinel.service.trainer import Trainer
    from grpo_sentinel.telemetry.traces import trace_sink

    metrics, traces = VARIANTS[variant]
    if metrics:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    if traces:
        os.environ.update(LANGFUSE_PUBLIC_KEY="pk-lf-bench", LANGFUSE_SECRET_KEY="sk-lf-bench",
                          LANGFUSE_BASE_URL=f"http://127.0.0.1:{port}")
    # Not telemetry: no checkpoints (disk time) and no early stop, so every run has `steps` steps.
    cfg = load_config(None, ["run.checkpoint_every=100000", "health.stop_on=[]", "telemetry.prometheus_port=0",
                             f"telemetry.prometheus={str(metrics).lower()}"], **{"run.steps": steps})
    with tempfile.TemporaryDirectory() as tmp:
        t0, c0 = time.perf_counter(), clock()
        t = Trainer(cfg, RunDir.new(Path(tmp), "bench", cfg), sinks=telemetry_sinks(cfg),
                    traces=trace_sink(cfg.traces) if traces else None)
        t.open()
        times, threads0 = [], other_threads_cpu()
        for _ in range(steps):
            t1 = clock()
            t.step()
            times.append(clock() - t1)
        threads = other_threads_cpu() - threads0
        t.close("completed")
        return {"times": times, "total": clock() - c0, "wall": time.perf_counter() - t0, "threads": threads}


class Receiver(BaseHTTPRequestHandler):
    """Accepts OTLP/HTTP metrics and traces and Langfuse scores, as a healthy backend would."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b'{"message": "Accepted"}' if self.path.endswith("/scores") else b""
        self.send_response(202 if body else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--worker", choices=list(VARIANTS))
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--threads", type=int, help="torch threads per worker (default: torch's, one per core)")
    ap.add_argument("--clock", choices=list(CLOCKS), default="wall", help="wall time, or the process's CPU time")
    args = ap.parse_args()
    if args.worker:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker, args.steps, args.port, CLOCKS[args.clock])))
        return
    live = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    dead = free_port()
    variants = ["off", *[v for v in args.variants if v != "off"]]  # "off" is the baseline of every ratio
    means, totals, walls, others = ({v: [] for v in variants} for _ in range(4))
    threads = ["--threads", str(args.threads)] if args.threads else []
    print(f"{machine()}; workers: {args.threads or 'default'} torch thread(s); clock: {args.clock}; "
          f"load average at start: {os.getloadavg()[0]:.2f}")
    for r in range(args.repeats):
        for v in variants:
            port = dead if v.endswith("_dead") else live.server_port
            out = subprocess.run([sys.executable, __file__, "--worker", v, "--steps", str(args.steps),
                                  "--port", str(port), "--clock", args.clock, *threads], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{v} failed:\n{out.stderr[-3000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            means[v].append(statistics.fmean(res["times"]))
            totals[v].append(res["total"])
            walls[v].append(res["wall"])
            others[v].append(res["threads"] / args.steps)
            print(f"  repeat {r + 1} {v}: mean {1000 * means[v][-1]:.1f} ms/step, total {totals[v][-1]:.1f} s "
                  f"({walls[v][-1]:.1f} s wall), other threads {1000 * others[v][-1]:.1f} ms/step", flush=True)
    mean = {v: statistics.median(m) for v, m in means.items()}
    total = {v: statistics.median(t) for v, t in totals.items()}
    wall = {v: statistics.median(t) for v, t in walls.items()}
    other = {v: statistics.median(t) for v, t in others.items()}
    print(f"{'variant':15} {'mean ms/step':>12} {'ratio':>6} {'total s':>8} {'ratio':>6} {'wall s':>7} {'threads ms/step':>15}"
          f"  (median over {args.repeats} processes of each one's mean over {args.steps} steps / its total, open to "
          f"close; {args.clock}; the other threads' CPU per step)")
    for v in variants:
        print(f"{v:15} {1000 * mean[v]:12.1f} {mean[v] / mean['off']:6.3f} {total[v]:8.1f} {total[v] / total['off']:6.3f}"
              f" {wall[v]:7.1f} {1000 * other[v]:15.1f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    live.shutdown()


if __name__ == "__main__":
    main()
