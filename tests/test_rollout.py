"""Sampling: our decode loop draws what generate() draws, and leaves the model as it found it.

What is bit-identical and what is not:
- Given the same weights, the loop on HF's forward (`exact=True`) computes the same logits as generate()
  and draws the same tokens from the same random stream: compared token for token against generate() run
  on the network the loop samples from (the adapter folded into the weights), sampled and greedy, two
  architectures. Sharing one prompt's prefill across its G completions changes the prefill's batch shape;
  on the CPUs we run, the per-row results of that matmul do not depend on it (the grouped cases check it).
- decoder.Decoder's run (the default path) computes the same function in other kernels (attention as two
  batched matmuls, not SDPA's), so its logits equal HF's to float precision, not bit for bit. Its contract
  is the distribution: along its own trajectory, its per-token probabilities equal HF's forward over the
  finished sequences to float tolerance, and it feeds the same draw from the same random stream, so with
  one seed it samples the exact path's sequences but where a draw falls within rounding of a boundary.
  On a GPU the run replays one captured step of fixed shape (attention over the cache's whole capacity,
  the keys not yet written masked): the same contract, checked here by re-running that step on the CPU.
- Folding W + s*B@A rounds differently from peft's W x + s*B(A x): the folded logits equal the
  adapter's to float precision (checked), not bit for bit, so a draw can flip only where its uniform
  number falls within rounding distance of a boundary between two tokens.
"""

import copy
import dataclasses

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import Linear as LoraLinear
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from grpo_sentinel.service.demo import build_tokenizer
from grpo_sentinel.service.grpo import lora
from grpo_sentinel.service.grpo.decoder import Decoder
from grpo_sentinel.service.grpo.rollout import SamplingDraw, completion_logits, decode, position_ids, sample

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = ["12+34=", "7+8=", "99+1=", "5+55=", "40+2=", "3+3=", "61+19=", "8+80="]


def with_adapter(base, seed=0, **lora_kwargs):
    """A peft model whose adapter is not zero (a fresh LoRA's B is): sampling must see the adapter."""
    torch.manual_seed(seed)
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM",
                                            **lora_kwargs))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module", params=["qwen2-demo", "llama"])
def model(request, demo_dir, tokenizer):
    if request.param == "qwen2-demo":
        return with_adapter(AutoModelForCausalLM.from_pretrained(demo_dir))
    # Another architecture, random init: grouped-query attention, untied head, no projection biases.
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)
    return with_adapter(LlamaForCausalLM(cfg))


def generate(net, tokenizer, prompts, max_new_tokens, greedy=False, temperature=1.0, top_p=1.0):
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    how = dict(do_sample=False) if greedy else dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    out = net.generate(**enc, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id,
                       eos_token_id=tokenizer.eos_token_id, remove_invalid_values=True, **how)
    return out[:, enc["input_ids"].shape[1]:]


MODES = {"t1": dict(), "t0.7-p0.9": dict(temperature=0.7, top_p=0.9), "greedy": dict(greedy=True)}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", ["distinct", "repeated-apart", "groups-of-8"])
def test_sampling_matches_generate_token_for_token(model, tokenizer, mode, layout):
    prompts = {"distinct": PROMPTS, "repeated-apart": PROMPTS * 2,
               "groups-of-8": [p for p in PROMPTS for _ in range(8)]}[layout]
    max_new = 12
    with torch.no_grad(), lora.folded(model) as net:
        torch.manual_seed(7)
        expected = generate(net, tokenizer, prompts, max_new, **MODES[mode])
    torch.manual_seed(7)
    roll = sample(model, tokenizer, prompts, max_new_tokens=max_new, exact=True, **MODES[mode])
    assert torch.equal(roll.completion_ids, expected)
    if mode != "greedy" and layout != "distinct":
        assert len({tuple(r.tolist()) for r in roll.completion_ids}) > len(PROMPTS)  # really sampled: repeats differ


def rerun(step):
    """A CUDA graph's contract on the CPU: replaying re-runs the captured step on the same buffers."""
    return step


@pytest.mark.parametrize("layout", ["padded", "same-length"])  # with a key mask / without (GQA: two SDPA paths)
@pytest.mark.parametrize("capture", [None, rerun], ids=["growing", "replayed"])  # the CPU's step / the GPU's
def test_fast_step_gives_hf_forward_probabilities_along_its_own_trajectory(model, tokenizer, layout, capture):
    prompts = [p for p in (PROMPTS if layout == "padded" else ["12+34=", "61+19=", "99+10="]) for _ in range(4)]
    tokenizer.padding_side = "left"
    enc = tokenizer(list(dict.fromkeys(prompts)), return_tensors="pt", padding=True, add_special_tokens=False)
    assert bool(enc["attention_mask"].all()) == (layout == "same-length")
    row = torch.arange(len(enc["input_ids"])).repeat_interleave(4)
    seen = []  # the logits each draw was given: [B, V] per token

    def draw(logits):
        seen.append(logits)
        return SamplingDraw(1.0, 1.0)(logits)

    torch.manual_seed(5)
    with torch.no_grad(), lora.folded(model) as net:
        step = Decoder.of(net)
        assert step is not None and step.capture is None  # both architectures take the fast path; a CPU, no graph
        step = dataclasses.replace(step, capture=capture)
        out = decode(net, enc["input_ids"], enc["attention_mask"], row, 12, draw=draw, eos=tokenizer.eos_token_id,
                     pad=tokenizer.pad_token_id, step=step)
        # HF's forward over the finished sequences, attending as decoding did (a finished row keeps attending).
        mask = torch.cat([enc["attention_mask"][row], torch.ones_like(out)], 1)
        ids = torch.cat([enc["input_ids"][row], out], 1)
        Lp, T = enc["input_ids"].shape[1], out.shape[1]
        hf = net(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask)).logits[:, Lp - 1 : Lp + T - 1]
    assert len(seen) == T and T > 1
    fast = torch.stack(seen, 1)  # [B, T, V]
    # Log-probabilities: every token's, the unlikely ones too (in probabilities they would hide under atol).
    torch.testing.assert_close(fast.log_softmax(-1), hf.float().log_softmax(-1), rtol=1e-4, atol=1e-4)


def test_a_step_the_device_will_not_capture_decodes_eagerly(model, tokenizer, caplog):
    def refuse(step):
        raise RuntimeError("operation not permitted when stream is capturing")

    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS[:2], return_tensors="pt", padding=True, add_special_tokens=False)
    row = torch.arange(2).repeat_interleave(4)
    out = {}
    with torch.no_grad(), lora.folded(model) as net:
        for name, capture in (("eager", None), ("refused", refuse)):
            torch.manual_seed(3)
            out[name] = decode(net, enc["input_ids"], enc["attention_mask"], row, 8, draw=SamplingDraw(1.0, 1.0),
                               eos=tokenizer.eos_token_id, pad=tokenizer.pad_token_id,
                               step=dataclasses.replace(Decoder.of(net), capture=capture))
    assert len(out["refused"]) == len(row) and torch.equal(out["refused"], out["eager"])
    assert "decoding without a captured step (operation not permitted" in caplog.text


@pytest.mark.parametrize("mode", MODES)
def test_fast_step_draws_the_exact_paths_sequences_from_the_same_seed(model, tokenizer, mode):
    """The same draw on the same random stream: equal but for rounding, the probabilities give the same
    tokens except where a uniform number falls within rounding of a boundary (none here, at most a few
    sequences on any CPU). The control, another seed, shows that agreement is not what the model alone gives."""
    prompts, max_new = [p for p in PROMPTS for _ in range(8)], 12

    def completions(seed, **how):
        torch.manual_seed(seed)
        ids = sample(model, tokenizer, prompts, max_new_tokens=max_new, **MODES[mode], **how).completion_ids
        return torch.nn.functional.pad(ids, (0, max_new - ids.shape[1]), value=tokenizer.pad_token_id)  # [B, max_new]

    exact = completions(7, exact=True)
    same = (completions(7) == exact).all(1).float().mean()
    assert same >= 0.9
    if mode != "greedy":
        assert (completions(8) == exact).all(1).float().mean() <= same - 0.25


def test_fast_step_declines_what_it_does_not_compute_as_hf_does(demo_dir, tokenizer):
    dropout = with_adapter(AutoModelForCausalLM.from_pretrained(demo_dir), lora_dropout=0.1)  # peft keeps its layers
    eager = with_adapter(AutoModelForCausalLM.from_pretrained(demo_dir, attn_implementation="eager"))
    torch.manual_seed(1)  # rotary angles that rescale with the sequence length: computed per forward by HF
    dynamic = with_adapter(LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None)))
    for model in (dropout, eager, dynamic):
        with lora.folded(model) as net:
            assert Decoder.of(net) is None
        assert sample(model, tokenizer, PROMPTS, max_new_tokens=4).completion_ids.shape[0] == len(PROMPTS)
    with lora.folded(with_adapter(AutoModelForCausalLM.from_pretrained(demo_dir))) as net:
        assert Decoder.of(net) is not None


def test_folded_logits_equal_the_adapters_to_float_precision(model, tokenizer):
    ids = tokenizer(PROMPTS[:1], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        adapter = model(input_ids=ids).logits
        with lora.folded(model) as net:
            folded = net(input_ids=ids).logits
        with lora.off(model) as net:
            base = net(input_ids=ids).logits
    torch.testing.assert_close(folded, adapter, rtol=1e-5, atol=1e-5)
    assert (adapter - base).abs().max() > 1e-3  # the adapter matters, so the comparison above means something


def test_sampling_leaves_weights_and_adapter_layers_as_they_were(model, tokenizer):
    before = {n: (p.data_ptr(), p.detach().clone(), p.requires_grad) for n, p in model.named_parameters()}
    modules = dict(model.named_modules())
    sample(model, tokenizer, PROMPTS, max_new_tokens=4)
    for n, p in model.named_parameters():
        ptr, value, grad = before[n]
        assert (p.data_ptr(), p.requires_grad) == (ptr, grad) and torch.equal(p, value), n
    assert dict(model.named_modules()).keys() == modules.keys()
    assert all(m is modules[n] for n, m in model.named_modules())


def test_weights_are_restored_when_sampling_fails(model, tokenizer):
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda *_: (_ for _ in ()).throw(RuntimeError("boom")))
    try:
        with pytest.raises(RuntimeError, match="boom"):
            sample(model, tokenizer, PROMPTS, max_new_tokens=4)
    finally:
        hook.remove()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert sum(isinstance(m, LoraLinear) for m in model.modules()) == len(TARGETS) * model.config.num_hidden_layers


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_logits_do_not_crash_sampling(model, tokenizer, bad):
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda mod, inp, out: out * bad)
    try:
        for greedy in (False, True):
            roll = sample(model, tokenizer, PROMPTS, max_new_tokens=5, greedy=greedy)
            assert ((roll.completion_ids >= 0) & (roll.completion_ids < len(tokenizer))).all()
    finally:
        hook.remove()


def test_rollout_masks_lengths_and_early_exit(demo_dir, tokenizer):
    model = with_adapter(AutoModelForCausalLM.from_pretrained(demo_dir))
    prompts = ["1+2=", "12+34="] * 4
    torch.manual_seed(0)
    roll = sample(model, tokenizer, prompts, max_new_tokens=30)
    eos = tokenizer.eos_token_id
    assert roll.completion_ids.shape[1] < 30  # the demo answers in a few tokens: the loop stopped early
    assert roll.prompt_lengths.tolist() == [4, 6] * 4
    Lp = roll.input_ids.shape[1] - roll.completion_ids.shape[1]
    assert roll.attention_mask[:, :Lp].sum(1).tolist() == roll.prompt_lengths.tolist()
    for ids, mask, n, trunc, text in zip(roll.completion_ids, roll.completion_mask, roll.lengths, roll.truncated,
                                         roll.texts):
        first_eos = (ids == eos).nonzero()
        assert bool(trunc) == (len(first_eos) == 0)
        if not trunc:
            k = int(first_eos[0]) + 1  # EOS included
            assert n == k and mask[:k].all() and not mask[k:].any()
            assert (ids[k:] == tokenizer.pad_token_id).all()
        assert text == tokenizer.decode(ids[: int(n)], skip_special_tokens=True)


def test_fused_training_forward_matches_peft_values_and_gradients(model, tokenizer):
    """The fused node folds the adapter into W (W + s B A), peft computes W x + s B (A x): both round, differently.
    Held to float64 (the same network in double precision): the fused values and gradients are as close to it
    as peft's own, and the gradients of both are float32-close to it (~1e-5 of their norm through 4 layers)."""
    ids = tokenizer(PROMPTS, return_tensors="pt", padding=True)["input_ids"]

    def run(net, ctx):
        net.zero_grad(set_to_none=True)
        net.train()
        with ctx:
            logits = net(input_ids=ids).logits
        (logits.double().log_softmax(-1)[..., 3]).sum().backward()
        net.eval()
        return logits.detach().double(), {n: p.grad.double() for n, p in net.named_parameters() if p.requires_grad}

    exact_logits, exact_grads = run(copy.deepcopy(model).double(), torch.enable_grad())
    peft_logits, peft_grads = run(model, torch.enable_grad())
    fused_logits, fused_grads = run(model, lora.fused(model))
    peft_error, fused_error = ((x - exact_logits).abs().max() for x in (peft_logits, fused_logits))
    assert 0 < peft_error < 1e-4 and fused_error < 2 * peft_error, (fused_error, peft_error)
    assert exact_grads.keys() == fused_grads.keys() and len(exact_grads) == 2 * len(TARGETS) * model.config.num_hidden_layers
    for n, g in exact_grads.items():  # a wrong gradient would be off by ~its norm
        peft_error, fused_error = ((x[n] - g).norm() / g.norm() for x in (peft_grads, fused_grads))
        assert g.norm() > 0 and peft_error < 1e-4 and fused_error < 1e-4, (n, fused_error, peft_error)


def test_layers_peft_builds_differently_keep_peft_forward(demo_dir, tokenizer):
    model = with_adapter(AutoModelForCausalLM.from_pretrained(demo_dir), lora_dropout=0.1)
    with lora.fused(model), lora.folded(model):
        assert sum(isinstance(m, LoraLinear) for m in model.modules()) == len(TARGETS) * 4  # none swapped


def test_shared_prompt_forward_matches_one_pass_over_whole_sequences(model, tokenizer):
    prompts = [p for p in PROMPTS[:3] for _ in range(4)] + PROMPTS[3:5]  # groups of 4 and two singletons
    torch.manual_seed(3)
    roll = sample(model, tokenizer, prompts, max_new_tokens=6)
    L, T = roll.input_ids.shape[1], roll.completion_ids.shape[1]

    def run(fn, rows=slice(None)):
        model.zero_grad(set_to_none=True)
        logits = fn()
        logits.float().log_softmax(-1).gather(-1, roll.completion_ids[rows].unsqueeze(-1)).sum().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}

    whole, whole_grads = run(lambda: model(input_ids=roll.input_ids, attention_mask=roll.attention_mask,
                                           position_ids=position_ids(roll.attention_mask)).logits[:, L - T - 1 : L - 1])
    shared, shared_grads = run(lambda: completion_logits(model, roll, slice(0, len(prompts))))
    torch.testing.assert_close(shared, whole, rtol=1e-4, atol=1e-4)
    for n, g in whole_grads.items():  # the gradient reaches the shared prompt through the expanded cache
        assert g.norm() > 0 and (shared_grads[n] - g).norm() / g.norm() < 1e-4, n
    alone, _ = run(lambda: completion_logits(model, roll, slice(12, 14)), slice(12, 14))  # distinct: one plain pass
    torch.testing.assert_close(alone, whole[12:14], rtol=1e-4, atol=1e-4)
