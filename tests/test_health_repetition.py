"""The repetition row: seq-rep-4 per completion (Welleck et al. 2019), computed from the completion texts
(by our trainer, and by the TRL callback from what its wrapped reward functions see), the step's mean in
the record, and the detector reading it."""

import numpy as np
import pytest

import zoo
from grpo_sentinel.telemetry.health.detectors import diagnose
from grpo_sentinel.telemetry.stats import repetition_rate


def test_repetition_rate_golden():
    # "a b c d a b c d a b": 10 words, 10 - 4 + 1 = 7 four-grams: abcd bcda cdab dabc abcd bcda cdab;
    # 4 distinct, so 3 of the 7 repeat an earlier one: 1 - 4/7 = 3/7.
    assert repetition_rate("a b c d a b c d a b") == pytest.approx(3 / 7)
    # "the answer is 4": 4 words, one 4-gram, nothing earlier to repeat.
    assert repetition_rate("the answer is 4") == 0.0
    # "x x x x x x": 6 words, 3 four-grams, all "x x x x": 1 distinct, 1 - 1/3 = 2/3.
    assert repetition_rate("x x x x x x") == pytest.approx(2 / 3)
    # Fewer words than n: no 4-gram at all, 0 (a short answer is not a loop). Whitespace of any kind splits.
    assert repetition_rate("42") == repetition_rate("") == 0.0
    assert repetition_rate("a\nb c\td a b c d") == repetition_rate("a b c d a b c d") == pytest.approx(1 - 4 / 5)
    # n = 2: "a a a b": bigrams aa aa ab, 2 distinct of 3.
    assert repetition_rate("a a a b", n=2) == pytest.approx(1 / 3)


def test_the_row_fires_on_loops_and_not_on_healthy_runs():
    for seed in range(5):
        onset, _ = zoo.truth(zoo.repetition, seed)
        found = [c for c in diagnose(zoo.make(zoo.repetition, seed)).conditions if c.id == "repetition"]
        # 0.7 q + 0.02 (1 - q) >= 0.3 at q = 0.41 of loops, 77 steps into a ramp to 0.8 over 150: after the onset,
        # and the 20-step mean lags it by up to a window.
        assert found and onset + 70 <= found[0].first_step <= onset + 100, (seed, found)
    log = zoo.make(zoo.healthy, 0)
    assert "repetition" in diagnose(log).not_assessable  # no column: not judged, never guessed
    log.series["repetition"] = np.full(len(log), 0.29)
    assert not [c for c in diagnose(log).conditions if c.id == "repetition"]
