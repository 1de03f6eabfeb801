"""Where telemetry's CPU goes at the defaults: each piece's CPU time on the thread that runs it.

One demo run as `bench_telemetry_overhead.py` runs its `defaults` variant (the sinks `grpo-sentinel
train` builds from the default config; OTLP and Langfuse to a live receiver in this process). The
sinks' own functions are wrapped by timers (nothing in them is changed for this); each piece's time is
`time.thread_time()`, exclusive (a wrapped call inside another is subtracted from it), per training step.
A piece the code does not have (an older revision) is left out.

    python benchmarks/profile_telemetry.py [--steps 40]

Before/after a change: the same command with `PYTHONPATH` pointing at an export of the older
`service/` and `telemetry/` (as `grpo_sentinel/service`, `grpo_sentinel/telemetry`).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter, defaultdict
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_telemetry_overhead as bench  # noqa: E402


def pieces():
    """(owner, function name, label) of every wrapped piece."""
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from grpo_sentinel.telemetry import langfuse_wire, otel, traces

    return [
        (otel.OTelSink, "_record", "metrics: record a step (the SDK's calls)"),
        (getattr(otel, "ServedAndPushed", None), "_push", "metrics: OTLP push (collect, encode, post)"),
        (PeriodicExportingMetricReader, "collect", "metrics: OTLP push (collect, encode, post)"),
        (traces.TraceSink, "_train", "traces: build training groups' spans"),
        (traces.TraceSink, "_eval", "traces: build held-out prompts' spans"),
        (langfuse_wire, "encode_spans", "traces: OTLP encoding (encode_spans)"),
        (langfuse_wire.gzip, "compress", "traces: gzip"),
        (langfuse_wire.CountingSpanExporter, "_send", "traces: span requests (the rest)"),
        (langfuse_wire.ScorePoster, "post", "traces: score requests"),
        (traces, "plan", "training thread: traces.plan"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    cpu, calls = defaultdict(float), Counter()
    local = threading.local()  # per thread: the stack of open wrapped calls' inner time

    def timed(f, label):
        def wrapper(*a, **k):
            stack = local.__dict__.setdefault("stack", [])
            t0 = time.thread_time()
            stack.append(0.0)
            try:
                return f(*a, **k)
            finally:
                dt, inner = time.thread_time() - t0, stack.pop()
                cpu[label] += dt - inner
                calls[label] += 1
                if stack:
                    stack[-1] += dt
        return wrapper

    for owner, name, label in pieces():
        if owner is not None and hasattr(owner, name):
            setattr(owner, name, timed(getattr(owner, name), label))
    live = ThreadingHTTPServer(("127.0.0.1", 0), bench.Receiver)
    threading.Thread(target=live.serve_forever, daemon=True).start()
    res = bench.worker("defaults", args.steps, live.server_port, time.process_time)
    live.shutdown()
    print(f"{bench.machine()}; load average {os.getloadavg()[0]:.2f}; mean step "
          f"{1000 * sum(res['times']) / args.steps:.1f} ms (process CPU, the receiver's included)")
    off = [k for k in cpu if not k.startswith("training thread")]
    for k in sorted(off) + sorted(set(cpu) - set(off)):
        print(f"{k:44} {1000 * cpu[k] / args.steps:6.2f} ms/step  ({calls[k]} calls)")
    print(f"{'telemetry threads, total':44} {1000 * sum(cpu[k] for k in off) / args.steps:6.2f} ms/step")


if __name__ == "__main__":
    main()
