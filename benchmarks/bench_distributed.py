"""Scaling: completions/s of the demo's full training step at 1 and 2 ranks (torch.distributed, gloo
on CPU here; NCCL on a GPU node), the scaling efficiency, and the cost of the per-step gather of
every rank's samples to rank 0, timed on its own.

Same global batch at every world size (8 prompts x 8 completions); each rank takes whole prompts.
The machine's cores are shared fairly: one rank uses every core's threads, N ranks one core's share
each (OMP_NUM_THREADS = cores / N). Runs alternate 1 and 2 ranks, `--repeats` times, each a fresh
torchrun; the median step time after two warm-up steps gives completions/s.

    python benchmarks/bench_distributed.py [--repeats 3] [--steps 12]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def worker(steps: int, out: Path) -> None:
    from grpo_sentinel.service.config import load_config
    from grpo_sentinel.service.distributed import from_env
    from grpo_sentinel.service.grpo.step import merge
    from grpo_sentinel.service.runs import RunDir
    from grpo_sentinel.service.trainer import Trainer

    cfg = load_config(None, ["run.sample_every=100000", "run.checkpoint_every=100000", "health.stop_on=[]",
                             "telemetry.prometheus=false"], **{"run.steps": steps + 10})
    dist = from_env("cpu", 300)
    parent = dist.broadcast(Path(tempfile.mkdtemp()) if dist.main else None)  # one host: one temporary folder
    run = RunDir.new(parent, "bench", cfg) if dist.main else RunDir(parent / "bench")
    dist.barrier()
    t = Trainer(cfg, run, dist=dist)
    t.open()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        t.step()
        times.append(time.perf_counter() - t0)
    # The gather alone: this rank's share of one more step, sent to rank 0 (and merged there) 20 times.
    shares, gather = [], dist.gather
    dist.gather = lambda share: shares.append(share) or gather(share)
    t.step()
    dist.gather = gather
    timed = []
    for _ in range(20):
        dist.barrier()
        t0 = time.perf_counter()
        parts = dist.gather(shares[0])
        if parts is not None:
            merge(parts)
        timed.append(time.perf_counter() - t0)
    t.close("completed")
    if dist.main:
        out.write_text(json.dumps({"world": dist.world, "times": times, "gather": timed,
                                   "completions": cfg.grpo.prompts_per_step * cfg.grpo.group_size}))
    dist.close()


def launch(world: int, steps: int) -> dict:
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, __file__, "--worker", "--steps", str(steps), "--out", str(out)]
        if world > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}", *cmd[1:]]
        env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // world))}
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode:
            sys.exit(f"{world} rank(s) failed:\n{p.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.worker:
        worker(args.steps, args.out)
        return
    import torch

    print(f"{os.cpu_count()} CPUs, torch {torch.__version__}, backend "
          f"{'nccl' if torch.cuda.is_available() else 'gloo'}; demo model, 8 prompts x 8 completions a step")
    runs: dict[int, list[dict]] = {1: [], 2: []}
    for r in range(args.repeats):
        for world in runs:
            res = launch(world, args.steps)
            runs[world].append(res)
            print(f"  repeat {r + 1}, {world} rank(s): {1000 * statistics.median(res['times'][2:]):.0f} ms/step", flush=True)
    cps = {w: statistics.median(x["completions"] / statistics.median(x["times"][2:]) for x in rs) for w, rs in runs.items()}
    gather = statistics.median(statistics.median(x["gather"]) for x in runs[2])
    step2 = statistics.median(statistics.median(x["times"][2:]) for x in runs[2])
    print(f"1 rank : {cps[1]:7.1f} completions/s")
    print(f"2 ranks: {cps[2]:7.1f} completions/s   speed-up {cps[2] / cps[1]:.2f}x, scaling efficiency "
          f"{cps[2] / cps[1] / 2:.0%}")
    print(f"gather of a step's samples to rank 0 (2 ranks): {1000 * gather:.2f} ms, {gather / step2:.1%} of a step")


if __name__ == "__main__":
    main()
