"""What does telemetry cost a training step? The demo's GRPO steps with telemetry off, on
(Prometheus reader + OTLP/HTTP push to a live receiver), and with OTLP pointed at a dead endpoint.

Variants run interleaved, each in a fresh process, `--repeats` times; the per-step wall time
(step + every sink's on_step) is the median after three warm-up steps. The receiver runs in
this (otherwise idle) parent process, like a collector elsewhere on the node.

    python benchmarks/bench_telemetry_overhead.py [--repeats 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

VARIANTS = ["off", "on", "dead_otlp"]


def worker(variant: str, steps: int, otlp_port: int) -> list[float]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.trainer import Trainer, build_policy, run_info
    from grpo_sentinel.telemetry.otel import OTelSink

    cfg = load_config(None, [], **{"run.steps": steps})
    sinks = []
    if variant != "off":
        otlp = OTLPMetricExporter(endpoint=f"http://127.0.0.1:{otlp_port}/v1/metrics", timeout=2)
        sinks = [OTelSink(("127.0.0.1", 0), otlp, export_interval_s=1.0)]
    with tempfile.TemporaryDirectory() as tmp:
        t = Trainer(cfg, Path(tmp))
        t.policy = build_policy(cfg)
        for sink in sinks:
            sink.start(run_info(cfg, Path(tmp), t.policy))
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            stats = t._train_one()
            for sink in sinks:
                sink.on_step(stats)
            times.append(time.perf_counter() - t0)
        for sink in sinks:
            sink.close()
    return times


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

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
    ap.add_argument("--otlp-port", type=int, default=0)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.otlp_port)))
        return
    live = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    ports = {"off": 0, "on": live.server_port, "dead_otlp": free_port()}
    medians = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--worker", v, "--steps", str(args.steps),
                                  "--otlp-port", str(ports[v])], capture_output=True, text=True, check=True)
            times = json.loads(out.stdout.strip().splitlines()[-1])
            medians[v].append(statistics.median(times[3:]))
            print(f"  repeat {r + 1} {v}: {1000 * medians[v][-1]:.1f} ms/step", flush=True)
    base = statistics.median(medians["off"])
    for v in VARIANTS:
        m = statistics.median(medians[v])
        print(f"{v}: median {1000 * m:.1f} ms/step, ratio to off {m / base:.3f}")
    live.shutdown()


if __name__ == "__main__":
    main()
