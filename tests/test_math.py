"""Golden values of MISSION.md, with the arithmetic written out."""

import math

import pytest
import torch

from grpo_sentinel.service.grpo import math as gm

pytestmark = pytest.mark.unit  # the inner loop: pure code, no model, no process (README, Tests)


def test_advantages_golden_unbiased_std():
    # rewards [1,1,0,0]: mean 0.5; unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735
    # A = +-0.5 / (0.57735 + 1e-4) = +-0.86588
    adv = gm.group_advantages(torch.tensor([[1.0, 1, 0, 0]]), torch.ones(1, 4))
    assert [round(a, 4) for a in adv[0].tolist()] == [0.8659, 0.8659, -0.8659, -0.8659]
    assert round(adv.mean().item(), 4) == 0.0
    # std of [a, a, -a, -a] (unbiased) = a * sqrt(4/3) = 0.86588 * 1.15470 = 0.99983
    assert round(adv.std(unbiased=True).item(), 4) == 0.9998


def test_population_std_is_the_known_trap():
    # With a population std (n): std = 0.5, A = 0.5 / 0.5001 = 0.9998, the wrong answer.
    r = torch.tensor([1.0, 1, 0, 0])
    wrong = (r - r.mean()) / (r.std(unbiased=False) + 1e-4)
    right = gm.group_advantages(r.view(1, 4), torch.ones(1, 4))[0]
    assert round(wrong[0].item(), 4) == 0.9998
    assert round(right[0].item(), 4) == 0.8659


@pytest.mark.parametrize("value", [0.0, 1.0])
def test_all_equal_rewards_teach_nothing(value):
    adv = gm.group_advantages(torch.full((1, 4), value), torch.ones(1, 4))
    assert adv.abs().max().item() == 0.0
    assert round(adv.std(unbiased=True).item(), 4) == 0.0


def test_invalid_samples_are_excluded_from_the_group_statistics():
    # Group [1, 1, 0, NaN(invalid)]: statistics over [1, 1, 0] only.
    # mean 2/3; unbiased var = ((1/3)^2 * 2 + (2/3)^2) / 2 = (2/9 + 4/9) / 2 = 1/3; std 0.57735
    r = torch.tensor([[1.0, 1.0, 0.0, float("nan")]])
    valid = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv = gm.group_advantages(r, valid)[0].tolist()
    s = math.sqrt(1 / 3) + 1e-4
    assert adv == pytest.approx([(1 / 3) / s, (1 / 3) / s, (-2 / 3) / s, 0.0], abs=1e-6)


def test_no_std_scaling_only_centres():
    adv = gm.group_advantages(torch.tensor([[1.0, 0, 0, 0]]), torch.ones(1, 4), scale=False)
    assert adv[0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_entropy_golden():
    # probs = softmax(logits): exp(l) / sum exp(l); H = -sum p ln p; the ceiling is ln 7 = 1.9459
    logits = torch.tensor([[[0.6667, -2.0, 1.3333, 0.0, -0.6667, 2.0, -1.3333]]])
    probs = torch.softmax(logits, -1)[0, 0].tolist()
    assert [round(p, 4) for p in probs] == [0.1295, 0.0090, 0.2522, 0.0665, 0.0341, 0.4912, 0.0175]
    assert round(gm.token_entropy(logits).item(), 4) == 1.3700
    assert round(math.log(7), 4) == 1.9459
    assert gm.token_entropy(torch.zeros(1, 1, 7)).item() == pytest.approx(math.log(7))  # uniform = ceiling


def test_entropy_chunking_does_not_change_the_result():
    logits = torch.randn(3, 5, 11)
    whole = gm.token_entropy(logits)
    for budget in (1, 33, 34, 10_000):  # one position per chunk, two, uneven, everything at once
        assert torch.allclose(gm.token_entropy(logits, chunk_elements=budget), whole)


def test_token_logprobs_match_log_softmax_with_temperature():
    logits, tokens = torch.randn(2, 3, 7), torch.randint(0, 7, (2, 3))
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(gm.token_logprobs(logits, tokens, 0.7), expected, atol=1e-6)


@pytest.mark.parametrize("budget", [1, 15, 10_000])
def test_chunked_logprobs_gradient_is_autograds(budget):
    # The gradient is recomputed chunk by chunk in backward; autograd through log_softmax is the reference.
    # The slice [:, :-1] makes the logits non-contiguous, as the step's are.
    full = torch.randn(3, 6, 5, dtype=torch.float64, requires_grad=True)
    tokens, weights = torch.randint(0, 5, (3, 5)), torch.randn(3, 5, dtype=torch.float64)
    (gm.token_logprobs(full[:, :-1], tokens, 0.7, chunk_elements=budget) * weights).sum().backward()
    ours, full.grad = full.grad, None
    expected = torch.log_softmax(full[:, :-1].float() / 0.7, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    (expected * weights).sum().backward()
    torch.testing.assert_close(ours, full.grad, rtol=1e-5, atol=1e-6)
    assert ours[:, -1].abs().max() == 0  # the position the slice dropped gets no gradient


def test_k3_kl_is_zero_at_equality_and_never_negative():
    logp = torch.log(torch.tensor([0.5, 0.1, 0.9]))
    assert gm.k3_kl(logp, logp).abs().max().item() == 0.0
    # d = ln(0.5) - ln(0.1) = ln 5: exp(d) - d - 1 = 5 - 1.6094 - 1 = 2.3906
    assert gm.k3_kl(torch.log(torch.tensor(0.1)), torch.log(torch.tensor(0.5))).item() == pytest.approx(2.3906, abs=1e-4)
    d = torch.randn(1000) * 5
    assert (gm.k3_kl(torch.zeros(1000), d) >= 0).all()


def test_clipped_surrogate():
    # ratio e^0.5 = 1.6487 with A = +1 is clipped to 1.2: loss -1.2, clip active.
    # ratio e^-0.5 = 0.6065 with A = +1: min(0.6065, 0.8) = 0.6065, unclipped.
    logp = torch.tensor([[0.5, -0.5]])
    loss, clipped = gm.clipped_surrogate(logp, torch.zeros(1, 2), torch.tensor([1.0]), 0.2, 0.2)
    assert loss[0].tolist() == pytest.approx([-1.2, -math.exp(-0.5)], abs=1e-4)
    assert clipped[0].tolist() == [1.0, 0.0]


def test_token_weights_per_loss_type():
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0]])  # lengths 4 and 1
    # grpo: each sequence weighs 1/2, spread over its own tokens
    assert gm.token_weights(mask, "grpo", 4).tolist() == [[1 / 8] * 4, [1 / 2, 0, 0, 0]]
    # dapo: 5 tokens, each 1/5
    assert torch.allclose(gm.token_weights(mask, "dapo", 4), torch.tensor([[0.2] * 4, [0.2, 0, 0, 0]]))
    # dr_grpo: 1 / (2 sequences * 4 max tokens) = 1/8 per token
    assert gm.token_weights(mask, "dr_grpo", 4).tolist() == [[1 / 8] * 4, [1 / 8, 0, 0, 0]]


# --- the train/inference mismatch and its correction (TRL 1.16's four modes) ---------------------------------

def test_importance_weights_truncate_and_mask_by_token_and_by_sequence():
    """Two sequences of two tokens, log p_trainer - log p_sampler = [[ln 2, ln 2], [ln 4, 0]], clip [0.5, 3]:
    token ratios [[2, 2], [4, 1]]; sequence ratios (products) [4, 4].
      token_truncate:    [[2, 2], [3, 1]]   (4 -> 3)                     changed [[0, 0], [1, 0]]
      token_mask:        [[2, 2], [0, 1]]   (4 > 3 -> 0)                 changed [[0, 0], [1, 0]]
      sequence_truncate: [[3, 3], [3, 3]]   (4 > 3 -> 3, every token)    changed everywhere
      sequence_mask:     [[0, 0], [0, 0]]   (4 > 3 -> 0)                 changed everywhere
    A padded token (mask 0) weighs 0 and never counts as changed."""
    ln2, ln4 = torch.log(torch.tensor(2.0)), torch.log(torch.tensor(4.0))
    d = torch.tensor([[ln2, ln2, 7.0], [ln4, 0.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    want = {"token_truncate": ([[2, 2, 0], [3, 1, 0]], [[0, 0, 0], [1, 0, 0]]),
            "token_mask": ([[2, 2, 0], [0, 1, 0]], [[0, 0, 0], [1, 0, 0]]),
            "sequence_truncate": ([[3, 3, 0], [3, 3, 0]], [[1, 1, 0], [1, 1, 0]]),
            "sequence_mask": ([[0, 0, 0], [0, 0, 0]], [[1, 1, 0], [1, 1, 0]]),
            "none": ([[1, 1, 0], [1, 1, 0]], [[0, 0, 0], [0, 0, 0]])}
    for mode, (w, changed) in want.items():
        got, ch = gm.importance_weights(d, mask, mode, 0.5, 3.0)
        assert torch.allclose(got, torch.tensor(w, dtype=torch.float32), atol=1e-5), mode
        assert ch.tolist() == [[bool(x) for x in r] for r in changed], mode
    # A lower bound: token ratio 0.25 (log -ln 4) is below 0.5: truncated up to 0.5, or masked to 0; no bound, kept.
    low = torch.tensor([[-ln4]])
    assert gm.importance_weights(low, torch.ones(1, 1), "token_truncate", 0.5, 3.0)[0].item() == pytest.approx(0.5)
    assert gm.importance_weights(low, torch.ones(1, 1), "token_mask", 0.5, 3.0)[0].item() == 0.0
    assert gm.importance_weights(low, torch.ones(1, 1), "token_mask", None, 3.0)[0].item() == pytest.approx(0.25)


def test_mismatch_k3_is_zero_when_they_agree_and_grows_with_the_gap():
    """k3 = r - log r - 1: at log r = 0 it is 0; at log r = ln 2, 2 - 0.6931 - 1 = 0.3069; at -ln 2, 0.5 + 0.6931 - 1 =
    0.1931 (asymmetric, always >= 0)."""
    d = torch.tensor([0.0, float(torch.log(torch.tensor(2.0))), -float(torch.log(torch.tensor(2.0)))])
    assert gm.mismatch_k3(d).tolist() == pytest.approx([0.0, 0.3069, 0.1931], abs=1e-4)
