"""Cheaper ways to run a peft LoRA model, each exact in what it computes, swapped in for one call.

Every LoRA projection y = W x + b + s * B (A x) costs peft three matmuls plus a multiply and an add
over the whole [tokens, out] output (and their backward), and a Python call that inspects the layer.
For the tiny models of the demo that overhead is most of a forward pass. Three stand-ins:

- folded: W + s * B @ A in the base layer (sampling, no gradients): one matmul.
- fused: one autograd node per projection, the adapter folded into its two big products (training).
- off: the base layer alone (the reference pass), without toggling peft's adapter state.

Each swaps modules in the network for the length of a `with` block and puts peft's layers back
afterwards; base weights are never modified in place, so the frozen reference stays bit-identical.
A layer peft builds differently (DoRA and other variants, LoRA biases, dropout, several active
adapters, mixed dtypes) keeps its own forward: the stand-ins are an optimisation, never a change.
"""

from __future__ import annotations

from contextlib import contextmanager
from weakref import WeakKeyDictionary

import torch
from peft.tuners.lora import Linear as LoraLinear

_SITES: WeakKeyDictionary = WeakKeyDictionary()  # network -> [(parent module, attribute, LoRA layer)]


@contextmanager
def folded(model):
    """The network to sample from, every simple LoRA layer replaced by its base layer holding W + s * B @ A.
    A model without adapters is returned as it is."""
    with _swapped(model, _fold) as net:
        yield net


@contextmanager
def fused(model):
    """The network with every simple LoRA layer computed by one autograd node (same values and gradients)."""
    with _swapped(model, _fuse) as net:
        yield net


@contextmanager
def off(model):
    """The network without its adapters: the base model, as peft's disabled adapters compute it."""
    with _swapped(model, lambda layer, data: layer.get_base_layer()) as net:
        yield net


@contextmanager
def _swapped(model, stand_in):
    """Replace each LoRA layer that `stand_in(layer, originals)` returns a module for; restore on exit."""
    if not hasattr(model, "get_base_model"):
        yield model
        return
    net = model.get_base_model()
    done = []  # (parent, attribute, LoRA layer)
    originals = []  # (parameter, its original data): folding points the base weight at a new tensor
    try:
        for parent, attr, layer in _sites(net):
            if layer.merged:
                raise ValueError("a LoRA adapter is merged into the base weights (peft merge()); unmerge it first: "
                                 "the reference pass needs the base weights as they were")
            if getattr(parent, attr) is not layer or layer.disable_adapters:
                continue  # already swapped by an enclosing block, or peft already runs the base layer alone
            module = stand_in(layer, originals)
            if module is not None:
                setattr(parent, attr, module)
                done.append((parent, attr, layer))
        yield net
    finally:
        for parent, attr, layer in done:
            setattr(parent, attr, layer)
        for param, data in originals:
            param.data = data


def _sites(net) -> list:
    """Where the LoRA layers sit, found once per network. A layer added later is simply not swapped
    (it runs peft's forward, still exact); one removed fails the identity check in _swapped."""
    sites = _SITES.get(net)
    if sites is None:
        sites = []
        for name, layer in net.named_modules():
            if isinstance(layer, LoraLinear):
                parent, _, attr = name.rpartition(".")
                sites.append((net.get_submodule(parent), attr, layer))
        _SITES[net] = sites
    return sites


def _simple(layer) -> str | None:
    """The one active adapter of a plain LoRA linear layer (no variant, bias, dropout), else None."""
    active = [a for a in layer.active_adapters if a in layer.lora_A]
    if len(active) != 1 or layer.fan_in_fan_out:
        return None
    a = active[0]
    if a in layer.lora_variant or layer.lora_bias[a] or not isinstance(layer.lora_dropout[a], torch.nn.Identity):
        return None
    return a


def _fold(layer, originals) -> torch.nn.Module | None:
    a = _simple(layer)
    if a is None:
        return None
    base = layer.get_base_layer()
    A, B = layer.lora_A[a].weight, layer.lora_B[a].weight
    W = base.weight.data
    originals.append((base.weight, W))
    with torch.no_grad():  # W + s * B @ A in one fused op, in the adapter's dtype (peft's), rounded once to W's
        base.weight.data = torch.addmm(W.to(A.dtype), B, A, alpha=layer.scaling[a]).to(W.dtype)
    return base


def _fuse(layer, originals) -> torch.nn.Module | None:
    a = _simple(layer)
    base = layer.get_base_layer()
    if a is None or layer.lora_A[a].weight.dtype != base.weight.dtype:  # peft computes mixed dtypes its own way
        return None
    return _FusedLoRA(base, layer.lora_A[a].weight, layer.lora_B[a].weight, layer.scaling[a])


class _FusedLoRA(torch.nn.Module):
    def __init__(self, base: torch.nn.Linear, A: torch.Tensor, B: torch.Tensor, scale: float):
        super().__init__()
        self.base, self.A, self.B, self.scale = base, A, B, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _LoRAFunction.apply(x, self.base.weight, self.base.bias, self.A, self.B, self.scale)


class _LoRAFunction(torch.autograd.Function):
    """y = x (W + s B A)^T + b. x [..., in], W [out, in], A [r, in], B [out, r]. W and b are frozen.

    The adapter is folded into the weight (W + s B A, an [out, r] x [r, in] product) for the two products
    over all N tokens, y and dx: one matmul each, and no rank-r product or add over [N, out] in the forward.
    The backward's rank-r products put r on the rows (A x^T, not x A^T): MKL runs [N, in] x [in, r] several
    times slower than [r, in] x [in, N] (docs/benchmarks.md). Same values and gradients as peft's
    W x + b + s B (A x), rounded differently.
    """

    @staticmethod
    def forward(ctx, x, W, b, A, B, scale):
        x2 = x.reshape(-1, x.shape[-1])  # [N, in]
        folded = torch.addmm(W, B, A, alpha=scale)  # [out, in]; exactly W while B = 0
        y = torch.addmm(b, x2, folded.T) if b is not None else x2 @ folded.T  # [N, out]
        # Not `folded`: a weight-sized copy per projection held to the backward (a model's worth of
        # weights on a large one); refolding there is one [out, r] x [r, in] product.
        ctx.save_for_backward(x2, W, A, B)
        ctx.scale, ctx.x_shape = scale, x.shape
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, grad):
        x2, W, A, B = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # [N, out]
        dx = dA = dB = None
        if ctx.needs_input_grad[0]:
            dx = (g @ torch.addmm(W, B, A, alpha=ctx.scale)).view(ctx.x_shape)  # g W + s (g B) A
        if ctx.needs_input_grad[3]:
            dA = ((B.T @ g.T) @ x2).mul_(ctx.scale)  # s (g B)^T x: [r, N] x [N, in]
        if ctx.needs_input_grad[4]:
            dB = ((A @ x2.T) @ g).T.mul_(ctx.scale)  # s g^T (x A^T): ([r, N] x [N, out])^T
        return dx, None, None, dA, dB, None
