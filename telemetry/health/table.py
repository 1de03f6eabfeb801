"""The health / pathology table (MISSION.md) as data: one row per condition. Detectors, the
diagnosis report, the alert annotations and docs/runbook.md all take their words from here.
"""

from __future__ import annotations

from dataclasses import dataclass

TRACED = ("all-same", "longest")  # the groups traces.plan can pick to explain a row (Row.traced)


@dataclass(frozen=True)
class Row:
    id: str
    severity: str  # critical | warning | info
    signals: str  # what is read together
    cause: str
    action: str
    dont: str = ""  # the tempting wrong move (docs/runbook.md "Do not")
    source: str = ""  # where the row's reading comes from (paper, framework docs, issue thread)
    # The groups whose generations show the row, traced at a step where it is active (traces.plan), beside
    # the highest- and lowest-reward ones: "all-same" (a group whose rewards are all equal: no signal),
    # "longest" (the group of the step's longest completion).
    traced: tuple[str, ...] = ()
    # The severities it is reported at, mildest first, when more than one: nonfinite is a warning until N
    # updates in a row are skipped; a drift row's warning turns critical (detectors._escalate, its held and
    # forecast stages).
    stages: tuple[str, ...] = ()

    def __post_init__(self):
        if unknown := set(self.traced) - set(TRACED):
            raise ValueError(f"row {self.id}: traced {sorted(unknown)}: the trace planner knows only {TRACED}")
        if self.stages and self.severity not in self.stages:
            raise ValueError(f"row {self.id}: its severity {self.severity!r} is not among its stages {self.stages}")

    @property
    def severities(self) -> tuple[str, ...]:
        return self.stages or (self.severity,)


TABLE: list[Row] = [
    Row(
        "reward_saturated",
        "warning",
        "correctness reward ~ its maximum over a window (groups all-correct)",
        "task too easy; the learning signal is gone",
        "stop early and keep the checkpoint; use harder prompts",
        dont="keep training to squeeze out more: with no signal left only the KL term and noise move the policy "
        "(kl_dominant comes next)",
        traced=("all-same",),
    ),
    Row(
        "signal_vanished",
        "warning",
        "frac_zero_std >= ~0.9 over a window (all-correct or all-wrong)",
        "prompts too easy or too hard for the policy; G too small",
        "raise G (8-16), dynamic sampling, a curriculum",
        dont="read `adv_std` for this: under group normalisation it never exceeds 1; `frac_zero_std` and its all-"
        "correct / all-wrong split are the gauge. Do not raise the LR to push through: there is no gradient "
        "to scale",
        traced=("all-same",),
    ),
    Row(
        "policy_collapse",
        "critical",
        "every group without signal on every step of a window and the step's reward the same from step to step, after "
        "the run had signal (not every group right)",
        "the policy collapsed to one answer for every prompt (always refuse, always the same tool call): a mode its "
        "reward pays a constant for",
        "stop; restore the last healthy checkpoint; lower the LR, raise beta or the temperature, and check that the "
        "reward separates the answers it sees",
        dont="read the calm curves as convergence: the loss is exactly 0 and the KL flat because nothing is learned any "
        "more; raising G does not help a policy that gives every completion the same answer",
        traced=("all-same",),
    ),
    Row(
        "adv_mean_drift",
        "critical",
        "per-sequence advantage mean != 0",
        "implementation bug in the advantage computation",
        "halt the run",
        dont="resume and hope: every update since the onset used wrong advantages; fix the code and restart from "
        "`checkpoints/last-healthy/`",
    ),
    Row(
        "nonfinite",
        "critical",
        "NaN/Inf in loss, reward, logits or gradients",
        "numerics (overflow, a bad batch, a bad reward function)",
        "skip the step; halt after N in a row",
        dont="lower the LR on one skipped step before looking at the step's samples: a reward function returning "
        "inf is a reward bug, not an optimiser problem",
        stages=("warning", "critical"),
    ),
    Row(
        "plateau_kl_flat",
        "warning",
        "reward slope ~ 0 early while KL ~ 0",
        "beta too large, or sampling temperature too low",
        "lower beta or use a KL schedule; raise the temperature",
        dont="raise the LR first: while beta dominates, a larger step mostly amplifies noise",
    ),
    Row(
        "plateau_grader_loose",
        "warning",
        "reward high and flat, KL normal, the strict verifier accepting far less of the same completions",
        "verifier too loose: 'just hitting' the format is rewarded",
        "tighten the verifier; multi-condition or partial credit",
        dont="read the reward as progress: judge by held-out `sample_acc` and the strict verifier",
    ),
    Row(
        "plateau_small_group",
        "warning",
        "reward flat and noisy (high windowed sd), G <= 4, high frac_zero_std",
        "G too small: noisy group statistics (variance of the mean ~ 1/G)",
        "raise G to 8-16",
        dont="just train longer: at G <= 4 the group noise does not average out (variance of the mean ~ 1/G)",
        traced=("all-same",),
    ),
    Row(
        "reward_hacking",
        "critical",
        "reward rising or high while sample_acc flat or falling beyond its noise; or, on the training samples, "
        "the verifier's acceptance 10 % below its peak while an auxiliary reward holds",
        "the policy found a grader loophole",
        "audit the grader; make format rewards conditional on correctness",
        dont="change the grader blind: open the generations of the steps around the onset first; raising beta only"
        " slows a hack down",
    ),
    Row(
        "kl_runaway",
        "critical",
        "KL above its bound or growing fast while reward falls",
        "policy drifting off the reference (reins too loose, LR too high)",
        "raise beta, lower the LR, clip the update ratio",
        dont="wait for the reward to recover: a runaway rarely reverses; roll back to `checkpoints/last-healthy/`",
    ),
    Row(
        "kl_dominant",
        "critical",
        "KL rising while frac_zero_std ~ 1: the KL term is the only gradient",
        "collapse mode: with no reward signal left, only the KL term moves the policy",
        "mask zero-advantage groups; length-normalise or drop the KL",
        dont="raise beta: the KL term is already the only gradient",
        traced=("all-same",),
    ),
    Row(
        "kl_acceleration",
        "warning",
        "KL growing super-linearly: its window mean rising beyond its noise three windows in a row, each rise larger "
        "than the one before and the last over 1.25x it",
        "the update is running away from the reference (LR too high or rising, beta decaying)",
        "lower the LR, raise beta or clip the update ratio before KL reaches its bound",
        dont="wait for kl_runaway: by then the policy is already off the reference; and do not read steady, linear KL "
        "growth as this (it is the healthy case)",
        stages=("warning", "critical"),
    ),
    Row(
        "entropy_collapse",
        "warning",
        "entropy far below its early baseline and falling, reward flat",
        "exploration lost; the model repeats itself",
        "raise the temperature, clip-higher, lower the LR",
        dont="confuse it with convergence on an easy task (that is reward_saturated: reward at its maximum, not "
        "flat below it)",
    ),
    Row(
        "entropy_blowup",
        "critical",
        "entropy approaching ln(V), or rising sharply while reward falls; often length pinned at max",
        "generation turning random",
        "stop; restore the last healthy checkpoint; lower the LR or clip",
        dont="page on entropy rising while reward rises and groups still carry signal: that is healthy exploration"
        " (`exploration`, info only)",
    ),
    Row(
        "entropy_drift",
        "warning",
        "entropy rising away from its early baseline beyond its noise while the reward is not rising",
        "generation loosening (LR too high, temperature drifting up, KL reins too loose): the early sign of entropy_blowup",
        "inspect recent generations; lower the LR or the temperature before entropy reaches ln V",
        dont="treat it as exploration: exploration is entropy rising *with* the reward (`exploration`, info)",
        stages=("warning", "critical"),
    ),
    Row(
        "exploration",
        "info",
        "entropy rising while reward rises and groups still carry signal",
        "healthy exploration",
        "none: annotate only",
        dont="lower the temperature or the LR: this is the healthy case",
    ),
    Row(
        "loss_spike",
        "warning",
        "loss far outside its rolling band (100x its recent median); critical at four orders of magnitude",
        "numerics or a bad batch",
        "inspect the step's samples; at four orders of magnitude, restore the last healthy checkpoint first",
        dont="halt on one 100x spike while reward and KL are intact: the GRPO loss scale moves with the advantages (it "
        "is exactly 0 on a step without signal)",
        stages=("warning", "critical"),
    ),
    Row(
        "loss_blowup",
        "critical",
        "|loss| above its early range (an order of magnitude over its early median) on a sustained share of updates",
        "the update is blowing up (unclipped ratios, LR too high): reward and accuracy fall next",
        "stop; restore `checkpoints/last-healthy/`; clip the ratio or lower the LR",
        dont="read one spike as this (that is loss_spike, a warning), or wait for the reward to fall: the loss blows up "
        "tens of steps before the damage shows",
    ),
    Row(
        "kl_only_learning",
        "warning",
        "loss falling while reward flat",
        "the optimiser is only shrinking KL",
        "check the reward signal and beta",
        dont="read the falling loss as progress: in GRPO the loss is not a progress measure; the reward and "
        "sample_acc are",
    ),
    Row(
        "late_degradation",
        "critical",
        "reward and sample_acc both decline over a long window after their peak (fixed eval set)",
        "algorithmic instability of long runs",
        "stop and keep the best checkpoint; clip ratios or lower the LR",
        dont="continue hoping for recovery, or keep the last checkpoint: keep the best one (`checkpoints/last-"
        "healthy/`)",
    ),
    Row(
        "length_pathology",
        "warning",
        "truncation rate high (length pinned at max_new_tokens), or wrong answers growing longer than right ones",
        "length bias or runaway generation",
        "overlong penalty or filter; token-level loss",
        dont="raise max_new_tokens to make truncation go away: it hides runaway generation and costs memory",
        traced=("longest",),
    ),
    Row(
        "length_drift",
        "warning",
        "completion length drifting up toward the cap, with the share of capped completions heading to half",
        "length bias or runaway generation starting: the early sign of length_pathology",
        "look at the longest recent completions; add an overlong penalty or a length-normalised loss",
        dont="raise max_new_tokens: the drift follows the cap",
        stages=("warning", "critical"),
    ),
    Row(
        "correctness_drop",
        "warning",
        "the verifier's acceptance of the training samples falling below its peak beyond its noise (with "
        "an auxiliary reward holding or rising: hacking)",
        "the policy is getting worse at the task, or, while an auxiliary reward (format, length, style) "
        "holds, learning that reward instead of the task",
        "open the recent generations; lower the LR if the reward falls too; make auxiliary rewards conditional on correctness",
        dont="wait for the held-out evaluation: it is sparse, and a decline or a hack shows on the training samples first",
        stages=("warning", "critical"),
    ),
    Row(
        "all_wrong_rising",
        "warning",
        "the share of all-wrong groups rising above its early level beyond its noise",
        "the policy is getting worse at the task (groups with no right answer teach nothing)",
        "check the LR and the reward; lower the LR or use easier prompts",
        dont="read it as harder prompts without checking: the prompt mix does not change mid-run unless a curriculum does it",
    ),
    Row(
        "train_inference_mismatch",
        "warning",
        "the sampler's log-probs drifting from the trainer's for the same tokens: mismatch KL (token-mean k3) above "
        "twice its early level beyond its noise; critical at 0.1, or a 10x jump in one step",
        "the sampler and the trainer compute different distributions: other precision (a bf16 sampler), other kernels, "
        "or a stale or broken weight sync (a jump: the sampler missed an update)",
        "check the weight sync first (a jump); sample and train in the same precision; turn on the importance-sampling "
        "correction (grpo.is_correction, TRL's vllm_importance_sampling_correction); lower the LR",
        dont="raise the LR or the clip range to push through: the updates are already off-policy, and runs collapse "
        "with the gradient norm blowing up after the mismatch grows",
        source="Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL training'; Liu & Li "
        "2025, 'When speed kills stability'; verl docs/algo/rollout_corr.md (|kl| > 0.1); prime-rl docs (< 0.015 "
        "for a correct implementation)",
        stages=("warning", "critical"),
    ),
]

TABLE += [
    Row(
        "no_progress",
        "warning",
        "the reward's best window mean never rose beyond its noise above its first window, and its line since the start "
        "is flat within its noise (the rise's 3-SE upper bound below reward_drop), for several windows, whatever the KL",
        "nothing is learned: LR too low, a reward that never pays, a task far too hard, a reference too close (beta too large)",
        "open a few generations and their rewards; check the reward function pays on a known-good "
        "answer; raise the LR or lower beta",
        dont="read a moving KL as learning: the KL moves with any update, learning or not; and do not wait for "
        "plateau_kl_flat, which needs KL ~ 0",
        source="Raschka, Build a Reasoning Model (From Scratch), ch. 7.2: 'Average rewards should go up'; issue 22 "
        "(a 400-step run that learned nothing, with KL > 1e-3)",
    ),
    Row(
        "zero_gradient",
        "critical",
        "gradient norm exactly 0 on every step of a window while groups still carry reward spread "
        "(every group all-same is signal_vanished at its extreme: the reward's doing)",
        "parameters frozen or detached (LoRA not attached, requires_grad off, an optimizer built before the adapter)",
        "halt; check which parameters require grad and that the optimizer holds them",
        dont="read a loss of exactly 0 as this: with one update a batch GRPO's loss value is 0 (ratio 1, advantages of "
        "mean 0) whatever the gradient; read grad_norm",
        source="DAPO (Yu et al., 2025, arXiv:2503.14476) s. 3.2: groups whose rewards are all equal have zero advantage "
        "and give no gradient; TRL GRPOTrainer docs (loss is 0 at the start)",
    ),
    Row(
        "kl_offset",
        "warning",
        "KL above its bound from the start and not growing (below kl_growth x its own early level)",
        "the reference is not the policy's starting point (an SFT model measured against its base model)",
        "use the starting checkpoint as the reference, or set the bound from the run's early KL",
        dont="raise beta or roll back: nothing is drifting; kl_runaway needs growth over the run's own early KL",
        source="issue 22 of this project: every SFT-then-GRPO pipeline measured against the base model starts at KL ~ 1",
    ),
    Row(
        "grad_norm_spike",
        "warning",
        "gradient norm far above the median of the steps before (10x)",
        "an outlier batch or a numerically unstable update; the precursor of loss spikes",
        "inspect the step's samples; keep max_grad_norm clipping on; lower the LR if they recur",
        dont="lower the LR on one spike: clipping already bounds its update; act when they recur or the loss follows",
        source="Molybog et al., 2023, 'A Theory on Adam Instability in Large-Scale Machine Learning' (arXiv:2304.09871): "
        "gradient-norm spikes precede loss spikes",
    ),
    Row(
        "clip_imbalance",
        "warning",
        "one side of the ratio clip active far more than the other (clip_ratio high vs low, 4x)",
        "the upper clip binding: unlikely tokens with positive advantage cannot grow (entropy collapse follows); "
        "the lower one: likely tokens pushed down hard",
        "clip-higher (a larger upper epsilon, e.g. 0.28); check the LR and the number of updates per batch",
        dont="tighten both clips: the asymmetry is the signal; DAPO loosens only the upper one",
        source="DAPO (Yu et al., 2025, arXiv:2503.14476) s. 3.1 'Clip-Higher'; TRL GRPOTrainer docs (clip_ratio/low_mean, "
        "clip_ratio/high_mean)",
    ),
    Row(
        "length_capped",
        "critical",
        "almost every completion cut at max_new_tokens (truncation window mean >= 0.9, from below 0.5 "
        "early in the run) while the reward is not rising",
        "runaway generation: cut answers are not graded, groups lose their spread and the gradient heads to 0",
        "stop; restore `checkpoints/last-healthy/`; add an overlong penalty or mask truncated completions",
        dont="raise max_new_tokens: the length follows the cap; and do not wait for the accuracy to fall",
        source="DAPO (Yu et al., 2025, arXiv:2503.14476) s. 3.4 'Overlong Reward Shaping'; TRL GRPOConfig "
        "mask_truncated_completions",
    ),
    Row(
        "repetition",
        "warning",
        "completions repeating themselves: the step's mean seq-rep-4 (the share of a completion's "
        "word 4-grams that repeat an earlier one) >= 0.3 over a window",
        "degenerate loops: the policy found that repeating a phrase is cheap (a length or format reward paying for it, "
        "entropy collapsing onto a few tokens), or sampling too cold",
        "open the step's generations; penalise repetition or cap the length reward; check the temperature and the "
        "entropy panel",
        dont="raise max_new_tokens or the length reward: a loop fills whatever room it is given",
        source="Welleck et al., 2019, 'Neural Text Degeneration with Unlikelihood Training' (arXiv:1908.04319): "
        "seq-rep-4, ~0.01 for human text, ~0.4 for greedy decoding of a likelihood-trained LM",
    ),
]

BY_ID = {r.id: r for r in TABLE}


OPERATIONAL = [
    (
        "training-stalled",
        "critical",
        "no step completed for 15 minutes (`grpo_step_last_timestamp_seconds`)",
        "a hung process, a lost GPU, a stuck data loader or reward function",
        "check the trainer process, its GPU and its data loader",
    ),
    (
        "metrics-export-failing",
        "warning",
        "OTLP metric exports failing (`grpo_telemetry_export_failures_total`)",
        "the collector is down or unreachable; training is unaffected",
        "check the collector endpoint (OTEL_EXPORTER_OTLP_ENDPOINT)",
    ),
    (
        "traces-dropped",
        "warning",
        "Langfuse spans or scores not delivered (`grpo_traces_dropped_total{reason}`)",
        "wrong keys (unauthorized), Langfuse down or unreachable, or traces produced faster than sent; training is unaffected",
        "check LANGFUSE_PUBLIC_KEY / LANGFUSE_SECRET_KEY and LANGFUSE_BASE_URL; lower traces.sample_rate if queue_full",
    ),
    (
        "run-failed",
        "warning",
        'a run the daemon trained ended `failed` (`grpo_runs_finished_total{status="failed"}`)',
        "an error in the run (bad data found late, a crash, an out-of-memory kill); the daemon goes on with the next run",
        "read the run's `error` (GET /v1/runs/<id>) and its train.log; fix and submit it again",
    ),
    (
        "rank-straggler",
        "warning",
        "one rank's busy time per step far above the fastest rank's (`grpo_rank_step_time_seconds` "
        "minus `grpo_rank_collective_wait_seconds`)",
        "a slow or throttled GPU, a noisy neighbour, a rank with longer prompts or a slow reward",
        "find the rank on the dashboard's rank panel; check its GPU (clocks, temperature, ECC) and node",
    ),
]
