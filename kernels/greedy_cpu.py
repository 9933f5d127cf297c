"""Greedy tokens from the LM head without its float32 product over the whole vocabulary (CPU).

A greedy row keeps one number of the LM head's output: the index of the largest logit. The LM
head is a fifth of a small model's decode FLOPs (SmolLM2: 49,152 x 576 of 134.5M parameters), and
at decode sizes it runs at the float32 kernel's rate. `greedy_tokens` instead:

1. computes every logit with bfloat16 operands and float32 sums (batchgen's bfloat16 kernel,
   AVX512-BF16: half the float32 head's bytes, two products per lane and instruction), each
   within a proven distance of its float32 value:
   |estimate - float32| <= coef * |x| * |w_v| + t, with coef from the formats (below), the
   Euclidean norms of x and of the head's row w_v (Cauchy-Schwarz bounds sum |x_k w_vk|) and t
   for what the bfloat16 instructions flush to zero (kernels/cpu_greedy.h);
2. keeps the candidates whose estimate plus that distance reaches the best estimate minus its
   own: the float32 argmax is always among them (3.4 a row on average, at most 119, over 576
   SmolLM2 decode rows of a ShareGPT run);
3. computes the candidates' float32 logits with the packed kernel's own arithmetic (one FMA chain
   in k order, cpu_linear.h), so each equals the full product's bit for bit, and returns the
   largest, the lowest index among equals: the token `argmax(linear(x, head))` gives.

A row it cannot decide (a non-finite estimate, or more than `_MAX_CANDIDATES` candidates) gets
its full float32 logits and `argmax`, as without this module. So the tokens are those of the
float32 path, always; only the time differs.

The bound, per logit, with u = 2^-8 (bfloat16's unit roundoff: 8 significant bits, round to
nearest even), K the head's in_features, S = sum_k |x_k w_vk| and gamma_K = K 2^-24 / (1 - K 2^-24)
(K float32 roundings): rounding x and w to bfloat16 moves each product by at most
(2u + u^2)|x_k w_vk|, and the bfloat16 products are exact in float32; the estimate's float32 sum of
them (in any order) errs by at most gamma_K (1 + u)^2 S, the float32 chain of the exact logit by
gamma_K S. coef = (2u + u^2 + gamma_K (2 + 2u + u^2)) (1 + 2^-8) covers the sum. The error comes to
0.93-0.99 of it where every rounding has one sign (tested at K = 4,096 to 64: inputs just below a
bfloat16 rounding midpoint), so the bound is nearly tight.

On the 2-core AVX-512 EPYC, SmolLM2's head at 64 rows: 4.4-4.5 ms screened against 7.0 in float32
(oneDNN's bfloat16 estimate, rounded to bfloat16: 5.3 ms and 16.9 candidates a row), at 1 to 8
rows 0.9-1.3 against 1.3-2.1; so every greedy step is screened.

Where the CPU has AVX512-VNNI, step 1 is instead an int8 estimate (kernels/cpu_greedy_int8.h: x
and the head quantized in groups of 64 k with a scale each, products summed exactly in int32,
groups in float32; its bound from the quantization errors themselves, group by group): a VNNI dot
product does 64 multiply-adds where a bfloat16 one does 32, from a quarter of the float32 head's
bytes. Its bound is looser than bfloat16's (about 12 candidates a row against 3 on ShareGPT rows),
so the candidates' float32 logits read the head's rows where the model keeps them anyway (a tied
embedding table: `rows`), K contiguous floats a candidate instead of a cache line per k of the
packed head. The same bench machine (`jobs/bench` figures in the README), SmolLM2's head with
its rows: 1 row 0.31 ms against 0.81-0.91 with bfloat16 estimates (1.93 for the float32 head), 8
rows 0.74-0.83 against 1.14, 64 rows 3.41-3.52 against 4.38-4.46 (8.1-8.2), 256 rows inside a
batch-256 run 14.8-15.7 against 17.1-17.8.

Used by the model for a step whose every sampling row is plain greedy (no processors, no
log-probabilities): `GreedyHead` holds the estimate's weight (int8, or the bfloat16 copy: half the
float32 head's bytes) and its bound's terms, beside the float32 head it checks against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_cpu import _named, load_cpu_kernel
from .dispatch import argmax
from .linear_cpu import (
    PackedLinear,
    batchgen_bf16_linear,
    batchgen_linear_panel,
    linear,
    pack_linear_weight,
)

__all__ = [
    "GreedyHead",
    "Int8Head",
    "estimate_logits",
    "greedy_head_supported",
    "greedy_int8_supported",
    "greedy_screen_available",
    "greedy_tokens",
    "pack_greedy_head",
]

# Candidates computed in float32 per row before the row takes the full product instead: 512 of
# them cost about 0.3 ms of scalar FMA chains (K = 576), a full SmolLM2 row about 2 ms.
_MAX_CANDIDATES = 512
_U = 2.0**-8  # bfloat16's unit roundoff


def _coef(in_features: int) -> float:
    gamma = in_features * 2.0**-24 / (1 - in_features * 2.0**-24)
    return (2 * _U + _U**2 + gamma * (2 + 2 * _U + _U**2)) * (1 + 2.0**-8)


@dataclass(frozen=True)
class Int8Head:
    """The LM head quantized for the int8 estimate (kernels/cpu_greedy_int8.h): the weight + 128 as
    uint8 [V16 / 16, Kp / 4, 16, 4], each (row, group of 64 k)'s scale, the groups' norms B
    ([V16 / 16, ng, 16]) and per row Q = |e_v| + gamma_K |w_v| ([V]), all rounded up. V16: the
    vocabulary padded to a multiple of 48, Kp: K to a multiple of 64 (zeros)."""

    weight: torch.Tensor
    scales: torch.Tensor
    group_norms: torch.Tensor
    group_norm_norms: torch.Tensor  # [V]: |B_v|, rounded up
    q: torch.Tensor


@dataclass(frozen=True)
class GreedyHead:
    """The float32 LM head (batchgen's packed kernel) and what estimates its logits: its int8
    form where the CPU has AVX512-VNNI, else its bfloat16 copy with the rows' norms."""

    exact: PackedLinear
    estimate: PackedLinear | None
    norms: torch.Tensor  # float32 [V]: each row's Euclidean norm, rounded up
    coef: float
    int8: Int8Head | None = None
    # the head's weight row-major ([V, K] float32) where the model keeps it anyway (an embedding
    # table the head is tied to): the candidates' float32 logits read a row each from it instead
    # of a cache line per k from the packed head (the same bits)
    rows: torch.Tensor | None = None


def greedy_int8_supported() -> bool:
    """Whether this machine's build has the int8 estimate (a CPU with AVX512-VNNI and AVX-512)."""
    try:
        return hasattr(load_cpu_kernel(), "greedy_estimate_int8")
    except RuntimeError:  # no compiler: no CPU kernels at all
        return False


def greedy_screen_available() -> bool:
    """Whether this machine screens a float32 LM head: batchgen's float32 kernel is built (the
    screen's candidates use its arithmetic) and so is an estimate (bfloat16 or int8). Where it
    is, the model packs its head for batchgen's kernel whatever library its projections use
    (before batchgen's kernel became the choice on Intel's AVX-512 CPUs, MKL's head left them
    unscreened): the screen takes a greedy step's head from a full float32 product, a fifth of
    SmolLM2's decode FLOPs, to a few candidates a row."""
    return batchgen_linear_panel() > 0 and (batchgen_bf16_linear() or greedy_int8_supported())


def greedy_head_supported(head: PackedLinear) -> bool:
    """Whether `pack_greedy_head` takes this head: packed for batchgen's float32 kernel, where this
    machine's build has batchgen's bfloat16 kernel (a CPU with AVX512-BF16) or the int8 estimate
    (AVX512-VNNI)."""
    packed = head.library == "batchgen" and head.compute_dtype == torch.float32 and not head.gated
    return packed and (batchgen_bf16_linear() or greedy_int8_supported())


def pack_greedy_head(
    head: PackedLinear, weight: torch.Tensor, kind: str | None = None, *, keep_rows: bool = False
) -> GreedyHead:
    """The greedy screen of `head`, which packs `weight` ([V, K] float32): estimates in int8 where
    this build has them, else in bfloat16 (`kind` "int8" or "bfloat16" forces one). `keep_rows`:
    the screen keeps a reference to `weight` (contiguous) for the candidates' float32 logits,
    for a weight the caller keeps anyway (a tied embedding table). Raises
    ValueError where `greedy_head_supported(head)` is False, the shapes differ, or the forced kind
    is not in this build."""
    if not greedy_head_supported(head):
        raise ValueError(
            "the greedy screen takes an LM head packed for batchgen's float32 kernel, on a CPU with AVX512-BF16 or AVX512-VNNI"
        )
    if weight.dtype != torch.float32 or tuple(weight.shape) != (head.out_features, head.in_features):
        raise ValueError(f"weight {weight.dtype} {tuple(weight.shape)} is not the packed head's [{head.out_features}, {head.in_features}] float32")
    if kind not in (None, "int8", "bfloat16"):
        raise ValueError(f"kind must be 'int8' or 'bfloat16', got {kind!r}")
    kind = kind or ("int8" if greedy_int8_supported() else "bfloat16")
    if kind == "int8" and not greedy_int8_supported():
        raise ValueError("the int8 greedy estimate needs a CPU with AVX512-VNNI")
    if kind == "bfloat16" and not batchgen_bf16_linear():
        raise ValueError("the bfloat16 greedy estimate needs a CPU with AVX512-BF16")
    # in float64, a slice of rows at a time (a float64 copy of a whole head would be its size
    # twice over); rounding to float32 stays within the 1e-6
    rows = range(0, weight.shape[0], 4096)
    norms = torch.cat([weight[i : i + 4096].double().norm(dim=1) for i in rows]).mul_(1 + 1e-6).float()
    kept = weight.contiguous() if keep_rows else None
    if kind == "int8":
        int8 = _pack_int8(weight, norms)
        return GreedyHead(exact=head, estimate=None, norms=norms, coef=_coef(head.in_features), int8=int8, rows=kept)
    return GreedyHead(
        exact=head,
        estimate=pack_linear_weight(weight, "batchgen", compute_dtype=torch.bfloat16),
        norms=norms,
        coef=_coef(head.in_features),
        rows=kept,
    )


_INT8_GROUP = 64  # greedy8::kGroup
_INT8_TILE = 48  # greedy8::kPanels x 16 columns
_INT8_TINY = 2.0**-40  # greedy8::kTinyScale: groups whose largest |w| is below it are left at 0


def _pack_int8(weight: torch.Tensor, norms: torch.Tensor) -> Int8Head:
    """`weight` [V, K] float32 as the int8 estimate reads it (Int8Head), computed in float64."""
    v, k = weight.shape
    v16 = -(-v // _INT8_TILE) * _INT8_TILE
    kp = -(-k // _INT8_GROUP) * _INT8_GROUP
    ng = kp // _INT8_GROUP
    gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
    w8 = torch.zeros(v16, kp, dtype=torch.uint8)
    scales = torch.zeros(v16, ng, dtype=torch.float32)
    group_norms = torch.zeros(v16, ng, dtype=torch.float32)
    q = torch.empty(v, dtype=torch.float32)
    bnorm = torch.empty(v, dtype=torch.float32)
    for i in range(0, v, 4096):
        rows = torch.zeros(min(4096, v - i), kp, dtype=torch.float64)
        rows[:, :k] = weight[i : i + 4096].double()
        groups = rows.view(-1, ng, _INT8_GROUP)
        # the scale as the kernel holds it (float32), used exactly from here on
        scale = (groups.abs().amax(dim=2) / 127).float().double()
        scale[groups.abs().amax(dim=2) < _INT8_TINY] = 0.0
        safe = torch.where(scale > 0, scale, 1.0)
        quant = torch.where(scale[..., None] > 0, (groups / safe[..., None]).round().clamp(-127, 127), 0.0)
        kept = quant * scale[..., None]
        err = (groups - kept).reshape(len(rows), -1).norm(dim=1)
        w8[i : i + len(rows)] = (quant.reshape(len(rows), kp) + 128).to(torch.uint8)
        scales[i : i + len(rows)] = scale.float()
        b = (kept.norm(dim=2) * (1 + 1e-6)).float()
        group_norms[i : i + len(rows)] = b
        bnorm[i : i + len(rows)] = (b.double().norm(dim=1) * (1 + 1e-6)).float()
        q[i : i + len(rows)] = ((err + gamma * norms[i : i + len(rows)].double()) * (1 + 1e-6)).float()
    if not bool(torch.isfinite(q).all()) or float(q.max()) > 1e30:
        raise ValueError("the LM head has values too large for the int8 greedy estimate")
    # [V16, Kp] -> [V16 / 16, Kp / 4, 16, 4]; [V16, ng] -> [V16 / 16, ng, 16]
    packed = w8.view(v16 // 16, 16, kp // 4, 4).permute(0, 2, 1, 3).contiguous()

    def by_panel(t: torch.Tensor) -> torch.Tensor:
        return t.view(v16 // 16, 16, ng).permute(0, 2, 1).contiguous()

    return Int8Head(weight=packed, scales=by_panel(scales), group_norms=by_panel(group_norms), group_norm_norms=bnorm, q=q)


def estimate_logits(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    """x's logits as the screen estimates them, float32 [M, V]: with bfloat16 operands and float32
    sums (within the bound of the module docstring of `linear(x, head.exact)`), or from int8 x and
    weights (within the bound of kernels/cpu_greedy_int8.h)."""
    with _named("batchgen::greedy_estimate"):
        if head.int8 is not None:
            est: torch.Tensor = load_cpu_kernel().greedy_estimate_int8(x.contiguous(), head.int8.weight, head.int8.scales)[0]
            return est[:, : head.exact.out_features]
        assert head.estimate is not None
        return linear(x, head.estimate)


def greedy_tokens(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    """argmax(linear(x, head.exact), dim=-1) for x [M, K] float32, int64 [M]; see the module."""
    x = x.contiguous()
    kernel = load_cpu_kernel()
    if head.int8 is not None:
        with _named("batchgen::greedy_estimate"):
            estimates, a, xn = kernel.greedy_estimate_int8(x, head.int8.weight, head.int8.scales)
        with _named("batchgen::greedy_screen"):
            tokens: torch.Tensor = kernel.greedy_screen_int8(
                estimates, a, xn, x, head.exact.packed, head.int8.group_norms, head.int8.group_norm_norms, head.int8.q,
                _MAX_CANDIDATES, head.rows,
            )
    else:
        estimates = estimate_logits(x, head)
        with _named("batchgen::greedy_screen"):
            tokens = kernel.greedy_screen(
                estimates, x, head.exact.packed, head.norms, head.coef, _MAX_CANDIDATES, head.rows
            )
    undecided = (tokens < 0).nonzero().flatten()
    if undecided.numel():
        rows = x.index_select(0, undecided)
        tokens[undecided] = argmax(linear(rows, head.exact))
    return tokens
