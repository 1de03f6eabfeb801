"""The reward contract: one bad sample spoils only itself, is counted by kind, never crashes."""

import math

import numpy as np
import pytest

from grpo_sentinel.service.config import GRPOSettings, RewardSpec
from grpo_sentinel.service.data import Verifier
from grpo_sentinel.service.rewards import RewardScorer

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)

CALLS = {"n": 0}


def flaky(completion, answer, prompt):
    return {"boom": lambda: 1 / 0, "none": lambda: None, "nan": lambda: math.nan,
            "inf": lambda: math.inf, "str": lambda: "1"}.get(completion, lambda: 0.5)()


def scorer(**grpo):
    specs = [RewardSpec(name="correct", weight=1.0), RewardSpec(name="tests.test_rewards:flaky", weight=2.0)]
    return RewardScorer(specs, Verifier("exact"), GRPOSettings(**grpo))


def test_invalid_values_are_counted_and_excluded():
    completions = ["7", "boom", "none", "nan", "inf", "str", "8"]
    s = scorer().score(completions, ["7"] * 7, ["3+4="] * 7)
    assert dict(s.invalid) == {"error": 1, "none": 1, "nan": 1, "inf": 1, "type": 1}
    assert s.valid.tolist() == [True, False, False, False, False, False, True]
    # valid ones: correct(1 or 0) + 2 * 0.5
    assert s.reward[0] == 2.0 and s.reward[6] == 1.0
    assert np.isnan(s.reward[1:6]).all()
    assert s.correct.tolist() == [True] + [False] * 6  # the verdict does not depend on the flaky grader


def test_fallback_policy_scores_invalid_samples_with_the_fallback():
    s = scorer(invalid_reward="fallback", reward_fallback=-1.0).score(["boom", "7"], ["7", "7"], ["p", "p"])
    assert s.valid.all()
    assert s.reward.tolist() == [0 + 2 * -1.0, 1 + 2 * 0.5]
    assert s.invalid["error"] == 1
