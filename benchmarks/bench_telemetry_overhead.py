"""What does telemetry cost a training step? The demo's full step (GRPO step, health monitor, run
record, every sink) with telemetry off; with metrics (Prometheus reader + OTLP/HTTP push to a live
receiver); with OTLP pointed at a dead endpoint; with Langfuse traces of one group every step to a
live receiver; and with Langfuse dead (nothing listens).

Variants run interleaved, each in a fresh process, `--repeats` times; the per-step wall time is the
median after three warm-up steps. The receivers run in this (otherwise idle) parent process, like a
collector and a Langfuse elsewhere on the network.

    python benchmarks/bench_telemetry_overhead.py [--repeats 5] [--steps 40]
"""

from __future__ import annotations

import argparse
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

VARIANTS = ["off", "metrics", "metrics_dead_otlp", "traces", "traces_dead"]


def worker(variant: str, steps: int, port: int) -> list[float]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.runs import RunDir
    from grpo_sentinel.service.trainer import Trainer
    from grpo_sentinel.telemetry.otel import OTelSink
    from grpo_sentinel.telemetry.traces import trace_sink

    cfg = load_config(None, ["run.sample_every=100000", "run.checkpoint_every=100000", "health.stop_on=[]",
                             "traces.train_every=1", "traces.flush_timeout_s=2"], **{"run.steps": steps})
    sinks, traces = [], None
    if variant.startswith("metrics"):
        otlp = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{port}/v1/metrics", timeout=2)
        sinks = [OTelSink(("127.0.0.1", 0), otlp, export_interval_s=1.0)]
    if variant.startswith("traces"):
        os.environ.update(LANGFUSE_PUBLIC_KEY="pk-lf-bench", LANGFUSE_SECRET_KEY="sk-lf-bench",
                          LANGFUSE_BASE_URL=f"http://127.0.0.1:{port}")
        traces = trace_sink(cfg.traces)
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(cfg, RunDir.new(Path(tmp), "bench", cfg), sinks=sinks, traces=traces)
        t.open()
        times = []
        for _ in range(steps - 1):
            t0 = time.perf_counter()
            t.step()
            times.append(time.perf_counter() - t0)
        t.close("completed")
    return times


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
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--worker", choices=VARIANTS)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.port)))
        return
    live = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    dead = free_port()
    ports = {"off": 0, "metrics": live.server_port, "metrics_dead_otlp": dead, "traces": live.server_port,
             "traces_dead": dead}
    medians = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--worker", v, "--steps", str(args.steps),
                                  "--port", str(ports[v])], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"{v} failed:\n{out.stderr[-3000:]}")
            times = json.loads(out.stdout.strip().splitlines()[-1])
            medians[v].append(statistics.median(times[3:]))
            print(f"  repeat {r + 1} {v}: {1000 * medians[v][-1]:.1f} ms/step", flush=True)
    base = statistics.median(medians["off"])
    print(f"{'variant':18} {'ms/step':>8} {'ratio to off':>13}  (median of {args.repeats} processes, "
          f"{args.steps} steps each; {os.cpu_count()} CPUs)")
    for v in VARIANTS:
        m = statistics.median(medians[v])
        print(f"{v:18} {1000 * m:8.1f} {m / base:13.3f}")
    live.shutdown()


if __name__ == "__main__":
    main()
