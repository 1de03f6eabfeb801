"""A real TRL GRPOTrainer on the embedded demo model (fp32, CPU: this machine emulates bf16 ~8x slower),
with SentinelCallback: built by tests/test_trl.py in its own process, and run as a script under torchrun
for the two-process test (it prints each rank's view as one JSON line).

    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 tests/trl_run.py MODEL_DIR OUTPUT_DIR RUNS_DIR PORT
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

G = 4  # num_generations
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def rows(n: int, offset: int = 0) -> list[dict]:
    from grpo_sentinel.service.data import addition_examples

    return [{"prompt": e.prompt, "answer": e.answer} for e in addition_examples()[offset:offset + n]]


def correct(prompts, completions, answer, **_):
    """The verifier: 1 for the exact answer, else 0."""
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def short(completions, **_):
    """An auxiliary reward (a format-style bonus): 0.1 for a completion of at most 3 characters."""
    return [0.1 * (len(c) <= 3) for c in completions]


def correct_always(completions, **_):
    """A verifier every completion satisfies: every group all-correct, the signal gone."""
    return [1.0] * len(completions)


def trainer(model_dir, output_dir, callback, reward_funcs, eval_rows: int = 0, **config):
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    settings = dict(per_device_train_batch_size=4 * G, num_generations=G, max_completion_length=6, beta=0.04,
                    learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True)
    if eval_rows:
        settings.update(eval_strategy="steps", per_device_eval_batch_size=4 * G)
    settings.update(config)
    args = GRPOConfig(output_dir=str(output_dir), use_cpu=True, bf16=False, gradient_checkpointing=False, **settings)
    return GRPOTrainer(model=str(model_dir), reward_funcs=reward_funcs, args=args, train_dataset=Dataset.from_list(rows(200)),
                       eval_dataset=Dataset.from_list(rows(eval_rows, offset=200)) if eval_rows else None,
                       peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM"),
                       callbacks=[callback])


def main() -> None:
    from grpo_sentinel.integrations.trl import SentinelCallback

    model_dir, output_dir, runs, port = sys.argv[1:5]
    cb = SentinelCallback(out_dir=runs, run_id="two", telemetry={"prometheus_port": int(port), "linger_s": 1.5},
                          health={"window": 3})
    served = cb.metrics_port  # bound at construction, on the launcher's rank 0 only
    # 6 completions a rank, groups of 4: a group spans both ranks.
    t = trainer(model_dir, output_dir, cb, SentinelCallback.wrap_rewards([correct_always]), max_steps=20,
                per_device_train_batch_size=6)
    t.train()
    print(json.dumps({"rank": int(os.environ["RANK"]), "metrics_port": served, "step": t.state.global_step,
                      "run_dir": str(cb.run_dir) if cb.run_dir else None}), flush=True)
    # Leave without tearing gloo down: its teardown races on 2 loaded cores, whatever the script does (seen
    # here). Exit with the group alive and it can abort (SIGABRT, pytorch#190489); destroy it (trainer.end())
    # and DDP's reducer, freed with the GIL held, joins a gloo worker that waits for the GIL to free the
    # last collective's tensors (a hang). The run is closed and this rank's line printed: nothing is lost.
    os._exit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
