"""grpo-sentinel on TRL's own GRPOTrainer: the callback records every logged step, serves /metrics, judges the
run against the health table while it trains and stops it on `reward_saturated`.

Runs as it is on a CPU: the model is grpo-sentinel's embedded demo (a ~1 M-parameter Qwen2-style model that
learns two-digit addition, built locally once), the reward an exact-match check that needs nothing installed
(TRL's own `accuracy_reward` needs math_verify). For your model: set MODEL to its directory (or hub id), the
dataset to yours, the reward to your verifier.

    pip install 'grpo-sentinel[trl]'
    python examples/trl_grpo.py            # then: grpo-sentinel diagnose runs/<the run id it prints>
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local

from datasets import Dataset  # noqa: E402  (after the offline switch)
from peft import LoraConfig  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from grpo_sentinel.integrations.trl import SentinelCallback  # noqa: E402
from grpo_sentinel.service.data import addition_examples  # noqa: E402
from grpo_sentinel.service.demo import demo_model_dir  # noqa: E402

MODEL = str(demo_model_dir())  # builds the demo model on first use (~90 s on 2 cores), then it is cached
STEPS = int(os.environ.get("STEPS", "40"))


def correct(prompts, completions, answer, **_):
    """The verifier: 1 for the exact answer, else 0. Named so the callback reads it as the correctness."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def main() -> None:
    problems = [{"prompt": e.prompt, "answer": e.answer} for e in addition_examples()]
    args = GRPOConfig(output_dir="trl-out", num_generations=8, per_device_train_batch_size=64, max_completion_length=6,
                      learning_rate=1e-3, beta=0.04, logging_steps=1, max_steps=STEPS, save_strategy="no",
                      report_to=[], use_cpu=True, bf16=False, gradient_checkpointing=False, disable_tqdm=True)
    callback = SentinelCallback(out_dir="runs", telemetry={"prometheus_port": 0})  # 0: any free port
    trainer = GRPOTrainer(model=MODEL, args=args, train_dataset=Dataset.from_list(problems[:2000]),
                          reward_funcs=SentinelCallback.wrap_rewards([correct]),
                          peft_config=LoraConfig(r=8, lora_alpha=16, task_type="CAUSAL_LM",
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
                          callbacks=[callback])
    trainer.train()
    print(f"run record: {callback.run_dir}")


if __name__ == "__main__":
    main()
