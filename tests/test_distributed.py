"""torch.distributed on CPU (gloo, 2 ranks on 127.0.0.1): the same maths as one process, one run
record, control on every rank, and a resume at another world size."""

import csv
import json
import os
import signal
import subprocess
import sys

import pytest

from helpers import REPO, cli, free_port, wait_for

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
FAST = ["--set", "telemetry.prometheus=false", "--set", "data.eval_size=20", "--set", "run.sample_every=4"]


def steps(run) -> list[str]:
    return [r["step"] for r in csv.DictReader((run / "steps.csv").open())] if (run / "steps.csv").is_file() else []


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "-m", "grpo_sentinel.service.cli", *args]


def test_torchrun_trains_one_run_with_one_record(tmp_path, demo_dir):
    p = subprocess.run(torchrun("train", "--out", str(tmp_path), "--set", "run.run_id=r", "--steps", "6", *FAST),
                       capture_output=True, text=True, env=ENV, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "r"
    assert steps(run) == [str(s) for s in range(1, 7)]  # rank 0 alone writes the record: one row per step
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert p.stdout.count("run completed at step 6") == 1  # one report, not one per rank


@pytest.mark.slow
def test_two_ranks_are_one_process_over_the_same_samples(tmp_path, demo_dir):
    out = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(REPO / "tests" / "dist_check.py"), str(out)], capture_output=True, text=True, env=ENV,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    main, other = json.loads(out.read_text())
    for name, (two, one) in main["scalars"].items():
        assert two == pytest.approx(one, rel=1e-5, abs=1e-7, nan_ok=True), name
    assert main["samples_equal"] and main["texts_equal"] and main["ranks"] == [0, 1]
    # The same gradient as one process, at each of the mu = 2 updates, to float rounding.
    assert main["updated"] and main["updates"] == [2, 2] and max(main["grad_rel_diff"]) < 1e-5, main["grad_rel_diff"]
    assert main["checksums_equal"] and main["adapters_bit_identical"]
    # A NaN on rank 1 only: the update is skipped on both.
    assert main["nan_skipped"] == "nonfinite"
    assert main["rank_adapter_unchanged_after_nan"] and other["rank_adapter_unchanged_after_nan"]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_at_one_checkpoint_and_the_run_resumes_on_one_rank(tmp_path, demo_dir):
    port = free_port()
    base = {**ENV, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    args = cli("train", "--out", str(tmp_path), "--set", "run.run_id=r", "--steps", "200",
               "--set", "run.checkpoint_every=50", *FAST)
    ranks = [subprocess.Popen(args, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    run = tmp_path / "r"
    try:
        assert wait_for(lambda: len(steps(run)) >= 3 or any(p.poll() is not None for p in ranks), 600, 0.05)
        ranks[1].send_signal(signal.SIGTERM)  # the signal reaches one rank only
        codes = [p.wait(timeout=300) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    assert codes == [75, 75], [p.stderr.read()[-2000:] for p in ranks]
    done = len(steps(run))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "preempted" and summary["step"] == done
    assert (run / "checkpoints" / f"step-{done:08d}" / "manifest.json").is_file()  # both stopped at this boundary
    r = subprocess.run(cli("train", "--resume", str(run), "--steps", str(done + 3)), capture_output=True, text=True,
                       env=ENV, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert steps(run) == [str(s) for s in range(1, done + 4)]  # every step exactly once, across world sizes
    assert json.loads((run / "summary.json").read_text())["world_size"] == 1


def test_a_world_size_that_does_not_divide_the_batch_is_refused_before_any_model_loads(tmp_path):
    p = subprocess.run(torchrun("train", "--out", str(tmp_path), "--set", "grpo.prompts_per_step=3", *FAST),
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert p.returncode != 0
    assert "grpo.prompts_per_step=3 cannot be split over 2 ranks" in p.stderr and "(1, 3)" in p.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_the_daemon_launches_a_two_rank_run_through_the_elastic_launcher(tmp_path, demo_dir):
    from helpers import Daemon

    d = Daemon(tmp_path / "state", env={"OMP_NUM_THREADS": "1"}).ready()
    try:
        assert d.call("POST", "/v1/runs", {"run": {"steps": 4, "run_id": "two", "sample_every": 4},
                                           "data": {"eval_size": 20}, "distributed": {"nproc_per_node": 2}})[0] == 201
        r = d.wait_status("two", {"completed", "failed"})
        assert r["status"] == "completed", (r, (d.state / "runs" / "two" / "train.log").read_text()[-3000:])
        assert steps(d.state / "runs" / "two") == ["1", "2", "3", "4"]
        assert json.loads((d.state / "runs" / "two" / "summary.json").read_text())["world_size"] == 2
    finally:
        d.stop(signal.SIGKILL)
