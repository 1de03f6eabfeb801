"""Decoding for a Llama-family model (Llama, Qwen2): the new tokens of a sampling call, in a fraction of the
ops of the model's own forward.

HF's forward for one new token per sequence issues ~290 aten ops on the demo model, plus the Python of its
modules, mask builder and cache; at sampling's small shapes that fixed cost per op is most of the time, and
SDPA's CPU flash kernel costs more for one query over a few dozen keys than two batched matmuls do. A run
(`Decoder.begin`) computes the same function with ~16 ops per layer and token:

- q, k and v are one matmul over their concatenated weights, gate and up another (concatenated once per
  sampling call, from the folded weights);
- the rotary angles of every position the call will reach are computed once (the model's own rotary
  module, so HF's rope types: all but the two that rescale with the sequence length), and the rotary
  embedding turns q and k together;
- attention is `baddbmm` (scores, the key mask added as a bias) + softmax in float32 + `bmm`, over views
  of a preallocated cache laid out [rows x key/value heads, capacity, head_dim]; grouped query heads are
  the rows of their key/value head's matmul, so nothing is repeated or packed;
- the residual adds ride on the output projections' `addmm`.

That is the same function, not the same rounding: attention sums in another order than SDPA's kernel, so
logits equal HF's forward to float precision, not bit for bit. tests/test_rollout.py holds the contract:
along the run's own trajectory every token's log-probability equals HF's forward over the finished
sequences, and the draws come from the same procedure and random stream as generate()'s.
`sample(..., exact=True)` decodes through HF's forward instead (token for token generate()'s).

`Decoder.of(net)` returns None for anything it does not recognise, and sampling then runs HF's forward: only
the exact classes below, SiLU MLPs, full attention in every layer, SDPA (the attention it replaces), a head
without bias, and every projection a plain nn.Linear (the adapter folded into it; a LoRA layer peft keeps
for itself leaves the model to HF).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

CLASSES = {"LlamaForCausalLM", "Qwen2ForCausalLM"}
# Rope types whose angles depend on the longest position in the forward pass (HF's dynamic_rope_update): a run
# computes every position's angles at once, so only types whose angle for a position is fixed are taken.
DYNAMIC_ROPE = {"dynamic", "longrope"}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Layer:
    norm_in: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]: q_proj, k_proj, v_proj stacked
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # [H, Hq D]
    o_bias: torch.Tensor | None
    norm_post: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]: gate_proj, up_proj stacked
    gate_up_bias: torch.Tensor | None
    down: torch.Tensor  # [H, I]
    down_bias: torch.Tensor | None


@dataclass(frozen=True)
class Decoder:
    embed: torch.Tensor  # [V, H]
    rotary: torch.nn.Module  # the model's own (any rope type but DYNAMIC_ROPE): [B, n] positions -> cos, sin [B, n, D]
    layers: list[_Layer]
    norm: torch.Tensor  # [H]
    head: torch.Tensor  # [V, H]
    eps: float
    sign: torch.Tensor  # [D]: -1 on the first half, +1 on the second (the rotary embedding's rotate_half)
    n_q: int  # query heads
    n_kv: int  # key/value heads
    head_dim: int
    scale: float
    # How a run's step is replayed: None (CPU) calls it token by token with shapes that grow with the keys;
    # `cuda_graph` (CUDA) captures one fixed-shape step per run and replays it (see _Replayed).
    capture: Callable[[Callable[[], torch.Tensor]], Callable[[], torch.Tensor]] | None = None

    @classmethod
    def of(cls, net) -> Decoder | None:
        """The decoder for `net` (a model as sampling runs it: the adapter folded), or None if it is not one
        this module computes as its own forward does."""
        config = net.config
        if type(net).__name__ not in CLASSES or config.hidden_act != "silu" or config._attn_implementation != "sdpa":
            return None
        if set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
            return None
        body = net.model
        if body.rotary_emb.rope_type in DYNAMIC_ROPE:
            return None
        linears = [net.lm_head] + [m for block in body.layers for m in (
            block.self_attn.q_proj, block.self_attn.k_proj, block.self_attn.v_proj, block.self_attn.o_proj,
            block.mlp.gate_proj, block.mlp.up_proj, block.mlp.down_proj)]
        norms = [body.norm] + [n for block in body.layers for n in (block.input_layernorm, block.post_attention_layernorm)]
        if any(type(m) is not torch.nn.Linear for m in linears) or net.lm_head.bias is not None:
            return None
        if len({n.variance_epsilon for n in norms}) != 1:
            return None
        attn, half = body.layers[0].self_attn, body.layers[0].self_attn.head_dim // 2
        sign = torch.cat([torch.full((half,), -1.0), torch.ones(attn.head_dim - half)]).to(net.lm_head.weight)
        return cls(embed=body.embed_tokens.weight, rotary=body.rotary_emb, layers=[_fuse(b) for b in body.layers],
                   norm=body.norm.weight, head=net.lm_head.weight, eps=norms[0].variance_epsilon, sign=sign,
                   n_q=config.num_attention_heads, n_kv=config.num_key_value_heads, head_dim=attn.head_dim,
                   scale=attn.scaling, capture=cuda_graph if net.device.type == "cuda" else None)

    def begin(self, cache: Cache, positions: torch.Tensor, allowed: torch.Tensor | None) -> Callable:
        """A run over `cache` (rollout._cache's preallocated layers, prefilled: B rows, `length` keys each):
        positions [B, T] the rotary positions of the T tokens it may be given, allowed [B, capacity] the keys
        each row may attend to (True) or None (every key). Called with the tokens [B], it returns the next
        logits [B, V]."""
        run = _Run(self, cache, positions, allowed)
        if self.capture is None:
            return run
        try:
            return _Replayed(run, self.capture)
        except RuntimeError as e:  # a capture the device refuses must not stop training: decode eagerly
            log.warning("decoding without a captured step (%s)", e)
            return run


class _Run:
    """One sampling call's decoding: `run(token)` appends the tokens [B] to the cache and returns the next
    logits [B, V]."""

    def __init__(self, dec: Decoder, cache: Cache, positions: torch.Tensor, allowed: torch.Tensor | None):
        self.dec = dec
        B, D = positions.shape[0], dec.head_dim
        cos, sin = dec.rotary(dec.head, positions)  # [B, T, D]; the model's dtype
        # HF's rotate_half(x) * sin is cat(-x2, x1) * sin = roll(x, D/2) * (sin with its first half negated):
        # the same products (negation is exact), one op instead of three.
        self.cos, self.sin = cos[:, :, None], (sin * dec.sign)[:, :, None]  # [B, T, 1, D]: broadcast over heads
        self.kv = [(layer.k, layer.v) for layer in cache.layers]  # [B, Hkv, capacity, D] each, written in place
        self.first = self.length = cache.layers[0].length  # the slot of the first new token; the keys so far
        self.t = 0
        self.bias = None  # [B Hkv, 1, capacity]: 0 where a row may attend, -inf where not; added to the scores
        if allowed is not None:
            bias = torch.zeros(allowed.shape, dtype=dec.head.dtype, device=allowed.device).masked_fill_(~allowed, -torch.inf)
            self.bias = bias.repeat_interleave(dec.n_kv, 0)[:, None]
        self.shape = B, D

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        """Attends over the keys written so far: shapes grow by one key a token."""
        L, t = self.length + 1, self.t
        logits = self.step(token, self.cos[:, t], self.sin[:, t], L - 1, L, None if self.bias is None else self.bias[..., :L])
        self.length, self.t = L, t + 1
        return logits

    def step(self, token: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slot: int | torch.Tensor, L: int,
             bias: torch.Tensor | None) -> torch.Tensor:
        """The tokens [B] through every layer: their keys and values written at `slot` (see _write), attention over
        the first L keys (with `bias`, [B Hkv, 1, L], if any), the next logits [B, V] out. cos, sin [B, 1, D]."""
        dec, (B, D) = self.dec, self.shape
        n, nk = dec.n_q, dec.n_kv
        h = F.embedding(token, dec.embed)  # [B, H]
        for layer, (keys, values) in zip(dec.layers, self.kv):
            x = F.rms_norm(h, h.shape[-1:], layer.norm_in, dec.eps)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias).view(B, -1, D)  # [B, Hq + 2 Hkv, D]
            qk = qkv[:, : n + nk]
            qk = qk * cos + qk.roll(D // 2, -1) * sin
            _write(keys, slot, qk[:, n:])
            _write(values, slot, qkv[:, n + nk :])
            h = _residual(h, self._attend(qk[:, :n], keys, values, L, bias), layer.o, layer.o_bias)
            gate, up = F.linear(F.rms_norm(h, h.shape[-1:], layer.norm_post, dec.eps), layer.gate_up,
                                layer.gate_up_bias).chunk(2, -1)
            h = _residual(h, F.silu(gate) * up, layer.down, layer.down_bias)
        return F.linear(F.rms_norm(h, h.shape[-1:], dec.norm, dec.eps), dec.head)

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, L: int,
                bias: torch.Tensor | None) -> torch.Tensor:
        """q [B, Hq, D] over the first L keys and values of [B, Hkv, capacity, D] -> [B, Hq D]. The g = Hq / Hkv
        query heads of a key/value head (HF's grouped-query order) are the g rows of its matmul."""
        dec, (B, D) = self.dec, self.shape
        g = dec.n_q // dec.n_kv
        q = q.reshape(B * dec.n_kv, g, D)
        k = keys.view(B * dec.n_kv, -1, D)[:, :L]  # [B Hkv, L, D]: views of the cache
        v = values.view(B * dec.n_kv, -1, D)[:, :L]
        if bias is None:
            scores = torch.bmm(q, k.transpose(1, 2)).mul_(dec.scale)
        else:
            scores = torch.baddbmm(bias, q, k.transpose(1, 2), alpha=dec.scale)  # [B Hkv, g, L]
        weights = torch.softmax(scores, -1, dtype=torch.float32).to(v.dtype)
        return torch.bmm(weights, v).view(B, -1)


class _Replayed:
    """A run whose step has one shape for every token, so that it can be captured once and replayed: on a GPU
    decoding one token is a few hundred small kernels, and launching them from Python costs more than running
    them (gpt-fast's observation). Replaying a CUDA graph launches them all at once.

    The token and the step's index live in device buffers the graph reads (the index advances inside it);
    attention runs over the cache's whole capacity with the keys not yet written masked out (-inf, and zeroed
    once so that no garbage meets the mask: 0 x NaN is NaN). The same function as _Run's step, over more keys
    that weigh exactly 0: equal logits to float rounding (tests/test_rollout.py replays it on the CPU)."""

    def __init__(self, run: _Run, capture):
        dec, B = run.dec, run.shape[0]
        device = run.cos.device
        capacity = run.kv[0][0].shape[2]
        for keys, values in run.kv:
            keys[:, :, run.first :].zero_(), values[:, :, run.first :].zero_()
        self.run, self.capacity = run, capacity
        self.token = torch.zeros(B, dtype=torch.long, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        self.slots = torch.arange(capacity, device=device)
        # [B Hkv or 1, 1, capacity]: the row's own key mask, or every key
        self.open = run.bias if run.bias is not None else torch.zeros(1, 1, capacity, dtype=dec.head.dtype, device=device)
        self.replay = capture(self._step)
        self.t.zero_()  # a capture may run the step to warm up

    def _step(self) -> torch.Tensor:
        run, t = self.run, self.t
        slot = t + run.first
        bias = self.open.masked_fill(self.slots > slot, -torch.inf)  # keys after this token's: not yet written
        logits = run.step(self.token, run.cos.index_select(1, t)[:, 0], run.sin.index_select(1, t)[:, 0], slot,
                          self.capacity, bias)
        t.add_(1)
        return logits

    def __call__(self, token: torch.Tensor) -> torch.Tensor:
        self.token.copy_(token)
        return self.replay().clone()  # the graph's output buffer is overwritten by the next replay


def cuda_graph(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """`fn` (no arguments; it reads and writes only tensors that outlive it) captured as a CUDA graph: returns
    a function that replays it and returns its output buffer. One warm-up call on a side stream first, as
    capture requires (cuBLAS creates its handles and workspaces there, outside the graph). Errors only for
    this thread's unsafe calls during the capture: telemetry's threads keep running."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        out = fn()

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


def _write(cache: torch.Tensor, slot: int | torch.Tensor, x: torch.Tensor) -> None:
    """x [B, Hkv, D] into cache [B, Hkv, capacity, D] at position `slot`: an int by plain indexing (on the CPU
    3 us cheaper than index_copy_, twice a layer and token), a [1] tensor on the device for a captured step
    (whose position must not be baked into the graph)."""
    if isinstance(slot, int):
        cache[:, :, slot] = x
    else:
        cache.index_copy_(2, slot, x[:, :, None])


def _residual(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """h + x W^T (+ b): with no bias one addmm, the add riding on the matmul."""
    return torch.addmm(h, x, weight.T) if bias is None else h + F.linear(x, weight, bias)


def _fuse(block) -> _Layer:
    """One decoder layer's weights with q, k, v and gate, up concatenated (copies, made per sampling call:
    the folded weights change every step)."""
    a, m = block.self_attn, block.mlp
    return _Layer(norm_in=block.input_layernorm.weight, qkv=torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                  qkv_bias=_cat_bias(a.q_proj, a.k_proj, a.v_proj), o=a.o_proj.weight, o_bias=a.o_proj.bias,
                  norm_post=block.post_attention_layernorm.weight,
                  gate_up=torch.cat([m.gate_proj.weight, m.up_proj.weight]), gate_up_bias=_cat_bias(m.gate_proj, m.up_proj),
                  down=m.down_proj.weight, down_bias=m.down_proj.bias)


def _cat_bias(*linears) -> torch.Tensor | None:
    biases = [m.bias for m in linears]
    if all(b is None for b in biases):
        return None
    return torch.cat([b if b is not None else m.weight.new_zeros(m.out_features) for b, m in zip(biases, linears)])
