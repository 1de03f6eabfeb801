"""The GRPO step on the real tiny model: KL, LoRA isolation, the non-finite guard, faults."""

import math
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_sentinel.service.config import load_config
from grpo_sentinel.service.trainer import Trainer
from helpers import new_run


@pytest.fixture
def trainer(tmp_path, demo_dir):
    def make(*overrides):
        cfg = load_config(None, ["run.sample_every=1000", "run.checkpoint_every=1000", *overrides],
                          **{"run.steps": 6})
        t = Trainer(cfg, new_run(tmp_path, cfg, "run"))
        from grpo_sentinel.service.trainer import build_policy

        t.policy = build_policy(cfg)
        return t
    return make


def adapter_and_base(model):
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    return lora, base


def test_kl_is_zero_before_the_first_update_and_positive_after(trainer):
    t = trainer()
    first = t._train_one()
    assert first.kl == 0.0  # zero-initialised LoRA B: policy == reference, bit for bit
    later = [t._train_one() for _ in range(3)]
    assert all(s.kl > 0 for s in later)
    assert all(s.samples.kl.min() >= 0 for s in later)  # k3 is never negative


def test_lora_learns_and_base_weights_stay_bit_identical(trainer):
    t = trainer()
    lora0, base0 = adapter_and_base(t.policy.model)
    for _ in range(3):
        t._train_one()
    lora1, base1 = adapter_and_base(t.policy.model)
    assert any(not torch.equal(lora0[n], lora1[n]) for n in lora0)
    assert all(torch.equal(base0[n], base1[n]) for n in base0)


def test_step_statistics_are_consistent(trainer):
    t = trainer()
    s = t._train_one()
    vocab = len(t.policy.tokenizer)  # 10 digits, '+', '=', <pad>, <eos>, <unk>
    x = s.samples
    assert abs(s.adv_mean) < 1e-6  # the sentinel
    assert s.adv_std <= 1.0
    assert s.reward == pytest.approx(float(x.reward.mean()))
    assert s.frac_zero_std == pytest.approx(float((x.group_reward_std == 0).mean()))
    assert s.frac_zero_std_correct + s.frac_zero_std_wrong <= s.frac_zero_std + 1e-9
    assert 0 < s.entropy_norm < 1 and s.entropy == pytest.approx(s.entropy_norm * math.log(vocab), rel=1e-5)
    assert s.response_len == pytest.approx(float(x.length.mean()))
    assert s.tokens_per_s > 0 and s.step_time > 0


def test_nan_logits_skip_the_update_and_keep_weights_finite(trainer, tmp_path):
    t = trainer()
    t._train_one()
    lora_before, _ = adapter_and_base(t.policy.model)
    # Inject NaN into the logits of the next forward passes (a real NaN through the real model).
    head = t.policy.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda mod, inp, out: out * float("nan"))
    stats = t._train_one()
    hook.remove()
    assert stats.skipped == "nonfinite" and t.state.faults == {"nonfinite": 1}
    lora_after, _ = adapter_and_base(t.policy.model)
    assert all(torch.equal(lora_before[n], lora_after[n]) for n in lora_before)  # no update at all
    after = t._train_one()
    assert after.skipped == "" and math.isfinite(after.loss)
    assert t.state.consecutive_faults == 0
    t._checkpoint()
    from safetensors.torch import load_file

    saved = load_file(t.run_dir / "checkpoints" / "step-00000003" / "adapter" / "adapter_model.safetensors")
    assert all(torch.isfinite(v).all() for v in saved.values())


def always_nan(completion, answer, prompt):
    return float("nan")


@pytest.mark.slow
def test_a_step_with_no_scored_sample_is_a_fault_and_repeated_faults_halt(tmp_path, demo_dir):
    cfg = load_config(None, ["rewards=[{name: 'tests.test_trainer:always_nan'}]", "run.max_consecutive_faults=2"],
                      **{"run.steps": 10, "run.out_dir": str(tmp_path)})
    result = Trainer(cfg, new_run(tmp_path, cfg, "run")).run_to_end()
    assert (result.status, result.step, result.exit_code) == ("halted", 2, 3)
    import csv

    rows = list(csv.DictReader((tmp_path / "run" / "steps.csv").open()))
    assert [r["skipped"] for r in rows] == ["no_scored_samples"] * 2
    assert [r["invalid_rewards"] for r in rows] == ["64", "64"]


FAULTS_PER_STEP = """
import resource, sys, torch
from grpo_sentinel.service.trainer import keep_freed_memory
keep_freed_memory()
x = torch.ones(64, 32, 512)  # a 32-token step's MLP activation: 4 MiB
counts = []
for _ in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    y = (x * x) * x  # two 4 MiB temporaries, freed again
    del y
    counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(counts[6:]))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists() or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_training_on_the_cpu_reuses_freed_memory_without_page_faults():
    # glibc's default is layout-dependent (its adaptive mmap and trim thresholds): in about a third of the
    # processes the two freed blocks coalesce at the heap's top and are trimmed, and each step's 1,024 + 1,024
    # pages fault in again, for ever; in the others the heap settles. Kept, every process settles within a few
    # steps (growing the heap faults once). Three processes, so a no-op would be caught most of the time.
    steady = [int(subprocess.run([sys.executable, "-c", FAULTS_PER_STEP], capture_output=True, text=True,
                                 check=True).stdout) for _ in range(3)]
    assert max(steady) < 16, steady  # faults over steps 7-12 of each process
