"""One decode step of a Llama-family model (Llama, Qwen2) for sampling, in fewer ops than its own forward.

HF's forward for one new token per sequence issues ~290 aten ops on the demo model, plus the Python of
its modules, mask builder and cache; at sampling's small shapes that fixed cost per op is most of the
time. This step computes the same function with ~25 ops per layer: q, k and v are one matmul over
their concatenated weights, gate and up another, the rotary embedding turns q and k together, and the
mask and the rotary angles are made once per token for every layer.

Each remaining op is the one HF runs, on the same values and in the same order (RMSNorm in float32,
SDPA with transformers 5.24's GQA packing for one query), and the rows of a matmul over concatenated
weights equal those of the separate matmuls on the CPUs we ran, so there the logits are bit-identical to
the model's own (tests/test_rollout.py samples token for token against generate() on both paths). Where a
kernel rounds differently, the test's per-token probabilities along the fast path's own trajectory still
hold it to HF's forward within float tolerance.

`Decoder.of(net)` returns None for anything it does not recognise, and sampling then runs HF's forward:
only the exact classes below, SiLU MLPs, full attention in every layer, SDPA, a head without bias, and every
projection a plain nn.Linear (the adapter folded into it; a LoRA layer peft keeps for itself leaves the model to HF).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

CLASSES = {"LlamaForCausalLM", "Qwen2ForCausalLM"}


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
    rotary: torch.nn.Module  # the model's own: every rope type HF supports, [B, n] positions -> cos, sin [B, n, D]
    layers: list[_Layer]
    norm: torch.Tensor  # [H]
    head: torch.Tensor  # [V, H]
    eps: float
    sign: torch.Tensor  # [D]: -1 on the first half, +1 on the second (the rotary embedding's rotate_half)
    n_q: int  # query heads
    n_kv: int  # key/value heads
    head_dim: int
    scale: float

    @classmethod
    def of(cls, net) -> Decoder | None:
        """The step for `net` (a model as sampling runs it: the adapter folded), or None if it is not one
        this module computes exactly as its own forward does."""
        config = net.config
        if type(net).__name__ not in CLASSES or config.hidden_act != "silu" or config._attn_implementation != "sdpa":
            return None
        if set(getattr(config, "layer_types", None) or ["full_attention"]) != {"full_attention"}:
            return None
        body = net.model
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
                   scale=attn.scaling)

    def step(self, token: torch.Tensor, position: torch.Tensor, cache: Cache, allowed: torch.Tensor | None) -> torch.Tensor:
        """token [B], position [B, 1], cache: one preallocated layer per decoder layer (rollout._cache),
        allowed [B, 1, 1, L] (True: attend; L = the cache's length after this token) or None (every key).
        Appends the token's keys and values to the cache; returns the next token's logits [B, V]."""
        B, D = len(token), self.head_dim
        h = F.embedding(token[:, None], self.embed)  # [B, 1, H]
        cos, sin = self.rotary(h, position)  # [B, 1, D]
        # HF's rotate_half(x) * sin is cat(-x2, x1) * sin = roll(x, D/2) * (sin with its first half negated):
        # the same products (negation is exact), one op instead of three.
        cos, sin = cos[:, None], (sin * self.sign)[:, None]  # [B, 1, 1, D], broadcast over the heads
        for layer, kv in zip(self.layers, cache.layers):
            x = self._rms(h, layer.norm_in)
            qkv = F.linear(x, layer.qkv, layer.qkv_bias).view(B, 1, -1, D).transpose(1, 2)  # [B, Hq + 2 Hkv, 1, D]
            qk, v = qkv[:, : self.n_q + self.n_kv], qkv[:, self.n_q + self.n_kv :]
            qk = qk * cos + qk.roll(D // 2, -1) * sin
            keys, values = kv.update(qk[:, self.n_q :], v)  # [B, Hkv, L, D]
            h = h + F.linear(self._attend(qk[:, : self.n_q], keys, values, allowed), layer.o, layer.o_bias)
            gate, up = F.linear(self._rms(h, layer.norm_post), layer.gate_up, layer.gate_up_bias).chunk(2, -1)
            h = h + F.linear(F.silu(gate) * up, layer.down, layer.down_bias)
        return F.linear(self._rms(h, self.norm), self.head)[:, -1]

    def _attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, allowed) -> torch.Tensor:
        """q [B, Hq, 1, D] over keys, values [B, Hkv, L, D] -> [B, 1, Hq D], as transformers' sdpa_attention_forward
        does for one query: with a mask, grouped query heads are packed onto their key/value head."""
        B, groups, gqa = len(q), self.n_q // self.n_kv, {}
        if groups > 1 and allowed is None:
            gqa = {"enable_gqa": True}
        elif groups > 1:
            q = q.reshape(B, self.n_kv, groups, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed, dropout_p=0.0, scale=self.scale,
                                             is_causal=False, **gqa)
        return out.reshape(B, -1, 1, self.head_dim).transpose(1, 2).reshape(B, 1, -1)

    def _rms(self, h: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """HF's Llama/Qwen2 RMSNorm, op for op: in float32, then back to the weights' dtype."""
        x = h.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(h.dtype)


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
