"""Greedy tokens from the LM head without its float32 product over the whole vocabulary (CPU).

A greedy row keeps one number of the LM head's output: the index of the largest logit. The LM
head is a fifth of a small model's decode FLOPs (SmolLM2: 49,152 x 576 of 134.5M parameters), and
at decode sizes it runs at the float32 kernel's rate. `greedy_tokens` instead:

1. computes every logit with bfloat16 operands (oneDNN, AVX512-BF16; about 1.6x faster at 64 rows
   on this project's 2-core AVX-512 EPYC), each within a proven distance of its float32 value:
   |estimate - float32| <= coef * |x| * |w_v|, with coef from the formats (below) and the
   Euclidean norms of x and of the head's row w_v (Cauchy-Schwarz bounds sum |x_k w_vk|);
2. keeps the candidates whose estimate plus that distance reaches the best estimate minus its
   own: the float32 argmax is always among them (on SmolLM2's logits 15 a row on average, over
   512 in one row of 2,445, over a ShareGPT run's decode steps);
3. computes the candidates' float32 logits with the packed kernel's own arithmetic (one FMA chain
   in k order, cpu_linear.h), so each equals the full product's bit for bit, and returns the
   largest, the lowest index among equals: the token `argmax(linear(x, head))` gives.

A row it cannot decide (a non-finite estimate, or more than `_MAX_CANDIDATES` candidates) gets
its full float32 logits and `argmax`, as without this module. So the tokens are those of the
float32 path, always; only the time differs.

The bound, per logit, with u = 2^-8 (bfloat16's unit roundoff: 8 significant bits, round to
nearest), K the head's in_features and S = sum_k |x_k w_vk|: rounding x and w to bfloat16 moves
each product by at most (2u + u^2)|x_k w_vk|; the float32 sums (oneDNN's, in any order, and the
kernel's chain) each err by at most gamma_2K S with gamma_n = n 2^-24 / (1 - n 2^-24); oneDNN's
bfloat16 result adds at most 2u (1 + ...) S, allowing for truncation. coef = 4u (1 + 2^-5) +
5 K 2^-24 covers the sum. The tests drive the error to half of it (inputs just below a bfloat16
rounding midpoint, all errors of one sign). A bfloat16 product flushed to zero (a subnormal)
errs by less than 2^-126, covered by an absolute 1e-30.

Used by the model for a step whose every sampling row is plain greedy (no processors, no
log-probabilities): `GreedyHead` holds the bfloat16 copy (half the float32 head's bytes) and the
row norms, beside the float32 head it checks against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_cpu import _cpu_flags, _named, load_cpu_kernel
from .dispatch import argmax
from .linear_cpu import (
    PackedLinear,
    linear,
    onednn_bf16_supported,
    onednn_linear,
    pack_linear_weight,
)

__all__ = ["GreedyHead", "greedy_head_supported", "greedy_tokens", "has_bf16_dot_products", "pack_greedy_head"]

# Candidates computed in float32 per row before the row takes the full product instead: 512 of
# them cost about 0.3 ms of scalar FMA chains (K = 576), a full SmolLM2 row about 2 ms.
_MAX_CANDIDATES = 512
_U = 2.0**-8  # bfloat16's unit roundoff
# Below this many rows the float32 head is cheaper than the estimate (it reads the weights from
# memory either way, and oneDNN's bfloat16 product at 16 rows costs as much as at 32): on the
# 2-core AVX-512 EPYC, SmolLM2's head at 16 rows 1.9 ms float32 against 2.9 screened, at 24 rows
# 2.9 against 3.1, at 32 rows 4.0 against 3.0.
_MIN_ROWS = 25


def _coef(in_features: int) -> float:
    return 4 * _U * (1 + 2.0**-5) + 5 * in_features * 2.0**-24


@dataclass(frozen=True)
class GreedyHead:
    """The float32 LM head (batchgen's packed kernel), its bfloat16 copy and its rows' norms."""

    exact: PackedLinear
    estimate: PackedLinear
    norms: torch.Tensor  # float32 [V]: each row's Euclidean norm, rounded up
    coef: float


def greedy_head_supported(head: PackedLinear) -> bool:
    """Whether `pack_greedy_head` takes this head: packed for batchgen's float32 kernel, on a CPU
    with bfloat16 dot products (AVX512-BF16 or AMX; oneDNN emulates them on other AVX-512 CPUs,
    where the estimate would cost more than it saves)."""
    return (
        head.library == "batchgen"
        and head.compute_dtype == torch.float32
        and not head.gated
        and has_bf16_dot_products()
        and onednn_bf16_supported()
    )


def has_bf16_dot_products() -> bool:
    """Whether the CPU has bfloat16 dot-product instructions (its flags name avx512_bf16 or amx_bf16)."""
    flags = _cpu_flags().split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def pack_greedy_head(head: PackedLinear, weight: torch.Tensor) -> GreedyHead:
    """The greedy screen of `head`, which packs `weight` ([V, K] float32). Raises ValueError
    where `greedy_head_supported(head)` is False or the shapes differ."""
    if not greedy_head_supported(head):
        raise ValueError("the greedy screen takes an LM head packed for batchgen's float32 kernel, on a CPU with bfloat16 linear layers")
    if weight.dtype != torch.float32 or tuple(weight.shape) != (head.out_features, head.in_features):
        raise ValueError(f"weight {weight.dtype} {tuple(weight.shape)} is not the packed head's [{head.out_features}, {head.in_features}] float32")
    # in float64, a slice of rows at a time (a float64 copy of a whole head would be its size
    # twice over); rounding to float32 stays within the 1e-6
    rows = range(0, weight.shape[0], 4096)
    norms = torch.cat([weight[i : i + 4096].double().norm(dim=1) for i in rows]).mul_(1 + 1e-6).float()
    return GreedyHead(
        exact=head,
        estimate=pack_linear_weight(weight, "onednn", compute_dtype=torch.bfloat16),
        norms=norms,
        coef=_coef(head.in_features),
    )


def greedy_tokens(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    """argmax(linear(x, head.exact), dim=-1) for x [M, K] float32, int64 [M]; see the module."""
    x = x.contiguous()
    if x.shape[0] < _MIN_ROWS:
        return argmax(linear(x, head.exact))
    with _named("batchgen::greedy_estimate"):
        # 64 rows a call at most (the estimate is compute-bound from about 32 rows), so that oneDNN
        # sees at most the eight row counts up to 64 (see linear_cpu.onednn_linear)
        rows = x.to(torch.bfloat16)
        parts = [onednn_linear(rows[i : i + 64], head.estimate.packed) for i in range(0, rows.shape[0], 64)]
        estimates = parts[0] if len(parts) == 1 else torch.cat(parts)
    with _named("batchgen::greedy_screen"):
        tokens: torch.Tensor = load_cpu_kernel().greedy_screen(
            estimates, x, head.exact.packed, head.norms, head.coef, _MAX_CANDIDATES
        )
    undecided = (tokens < 0).nonzero().flatten()
    if undecided.numel():
        rows = x.index_select(0, undecided)
        tokens[undecided] = argmax(linear(rows, head.exact))
    return tokens
