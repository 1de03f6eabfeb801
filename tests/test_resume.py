"""Crash safety with a real `grpo-sentinel train` process: SIGKILL, SIGKILL mid-checkpoint, SIGTERM."""

import csv
import random
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import cli, wait_for

pytestmark = pytest.mark.slow  # the second tier (README, Tests)

STEPS = 24
ARGS = ["--steps", str(STEPS), "--set", "run.sample_every=8", "--set", "run.checkpoint_every=5",
        "--set", "run.eval_seed=7", "--set", "telemetry.prometheus=false"]


def start(out: Path, run_id: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(cli("train", "--out", str(out), "--set", f"run.run_id={run_id}", *ARGS, *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def resume(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(cli("train", "--resume", str(run_dir)), capture_output=True, text=True, timeout=600)


def rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def steps_done(run_dir: Path) -> int:
    try:
        return len(rows(run_dir / "steps.csv"))
    except (FileNotFoundError, KeyError):
        return 0


@pytest.fixture(scope="module")
def reference(tmp_path_factory, demo_dir) -> Path:
    """An uninterrupted run to compare against."""
    out = tmp_path_factory.mktemp("ref")
    p = start(out, "ref")
    assert p.wait(timeout=600) == 0, p.stdout.read()
    return out / "ref"


def assert_same_run(run_dir: Path, reference: Path):
    got, want = rows(run_dir / "steps.csv"), rows(reference / "steps.csv")
    assert [r["step"] for r in got] == [str(s) for s in range(1, STEPS + 1)]  # every step exactly once
    # Same seed on CPU: the resumed run samples and learns exactly what the uninterrupted one did.
    for key in ("reward", "kl", "loss", "sample_acc"):
        assert [r[key] for r in got] == [r[key] for r in want], key
    curve, ref_curve = rows(run_dir / "reward-vs-step.csv"), rows(reference / "reward-vs-step.csv")
    keys = ("step", "reward", "kl", "loss", "sample_acc", "greedy_acc", "steps_in_window")  # not timings
    assert [[r[k] for k in keys] for r in curve] == [[r[k] for k in keys] for r in ref_curve]
    assert [r["step"] for r in curve] == ["0", "8", "16", "24"]


def test_sigkill_at_a_random_step_then_resume_is_exact(tmp_path, reference):
    kill_after = random.Random().randint(6, STEPS - 3)
    p = start(tmp_path, "run")
    assert wait_for(lambda: steps_done(tmp_path / "run") >= kill_after or p.poll() is not None)
    p.kill()
    p.wait()
    r = resume(tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert_same_run(tmp_path / "run", reference)


def test_sigkill_during_a_checkpoint_write_is_skipped_on_resume(tmp_path, reference):
    # Checkpoint every step, and kill the moment a temporary checkpoint folder appears.
    p = start(tmp_path, "run", "--set", "run.checkpoint_every=1")
    ckpts = tmp_path / "run" / "checkpoints"
    seen = wait_for(lambda: steps_done(tmp_path / "run") >= 4 and any(ckpts.glob(".tmp-*")) or p.poll() is not None)
    p.kill()
    p.wait()
    assert seen
    torn = list(ckpts.glob(".tmp-*"))
    r = resume(tmp_path / "run")
    assert r.returncode == 0, r.stderr
    if torn:  # the kill landed inside the write (it almost always does: the poll is ~5 ms)
        assert "skipping torn checkpoint" in r.stderr
    assert not list(ckpts.glob(".tmp-*"))
    assert_same_run(tmp_path / "run", reference)


def test_a_corrupt_checkpoint_is_skipped_for_the_previous_one(tmp_path, reference):
    p = start(tmp_path, "run")
    assert wait_for(lambda: steps_done(tmp_path / "run") >= 12 or p.poll() is not None)
    p.kill()
    p.wait()
    newest = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))[-1]
    (newest / "trainer.pt").write_bytes(b"garbage")
    r = resume(tmp_path / "run")
    assert r.returncode == 0, r.stderr
    assert f"skipping checkpoint {newest.name}: trainer.pt is missing or does not match the manifest" in r.stderr
    assert_same_run(tmp_path / "run", reference)


def test_sigterm_checkpoints_at_the_step_boundary_and_exits_preempted(tmp_path, reference):
    p = start(tmp_path, "run")
    assert wait_for(lambda: steps_done(tmp_path / "run") >= 7 or p.poll() is not None)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) == 75
    run = tmp_path / "run"
    done = steps_done(run)
    ckpts = sorted(run.glob("checkpoints/step-*"))
    assert ckpts[-1].name == f"step-{done:08d}"  # nothing trained after the checkpoint
    import json

    assert json.loads((run / "summary.json").read_text())["status"] == "preempted"
    r = resume(run)
    assert r.returncode == 0, r.stderr
    assert_same_run(run, reference)


def test_resuming_a_finished_run_does_nothing(reference):
    # Every file of the record untouched; the lock file is not the record (it names its last holder).
    def files():
        return {p: p.stat().st_mtime_ns for p in reference.rglob("*") if p.is_file() and p.name != ".lock"}
    before = files()
    r = resume(reference)
    assert r.returncode == 0
    assert "already finished at step 24; nothing to do" in r.stderr
    assert files() == before
