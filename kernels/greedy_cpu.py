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

Used by the model for a step whose every sampling row is plain greedy (no processors, no
log-probabilities): `GreedyHead` holds the bfloat16 copy (half the float32 head's bytes) and the
row norms, beside the float32 head it checks against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention_cpu import _named, load_cpu_kernel
from .dispatch import argmax
from .linear_cpu import PackedLinear, batchgen_bf16_linear, linear, pack_linear_weight

__all__ = ["GreedyHead", "estimate_logits", "greedy_head_supported", "greedy_tokens", "pack_greedy_head"]

# Candidates computed in float32 per row before the row takes the full product instead: 512 of
# them cost about 0.3 ms of scalar FMA chains (K = 576), a full SmolLM2 row about 2 ms.
_MAX_CANDIDATES = 512
_U = 2.0**-8  # bfloat16's unit roundoff


def _coef(in_features: int) -> float:
    gamma = in_features * 2.0**-24 / (1 - in_features * 2.0**-24)
    return (2 * _U + _U**2 + gamma * (2 + 2 * _U + _U**2)) * (1 + 2.0**-8)


@dataclass(frozen=True)
class GreedyHead:
    """The float32 LM head (batchgen's packed kernel), its bfloat16 copy and its rows' norms."""

    exact: PackedLinear
    estimate: PackedLinear
    norms: torch.Tensor  # float32 [V]: each row's Euclidean norm, rounded up
    coef: float


def greedy_head_supported(head: PackedLinear) -> bool:
    """Whether `pack_greedy_head` takes this head: packed for batchgen's float32 kernel, where this
    machine's build has batchgen's bfloat16 kernel (a CPU with AVX512-BF16)."""
    return head.library == "batchgen" and head.compute_dtype == torch.float32 and not head.gated and batchgen_bf16_linear()


def pack_greedy_head(head: PackedLinear, weight: torch.Tensor) -> GreedyHead:
    """The greedy screen of `head`, which packs `weight` ([V, K] float32). Raises ValueError
    where `greedy_head_supported(head)` is False or the shapes differ."""
    if not greedy_head_supported(head):
        raise ValueError("the greedy screen takes an LM head packed for batchgen's float32 kernel, on a CPU with AVX512-BF16")
    if weight.dtype != torch.float32 or tuple(weight.shape) != (head.out_features, head.in_features):
        raise ValueError(f"weight {weight.dtype} {tuple(weight.shape)} is not the packed head's [{head.out_features}, {head.in_features}] float32")
    # in float64, a slice of rows at a time (a float64 copy of a whole head would be its size
    # twice over); rounding to float32 stays within the 1e-6
    rows = range(0, weight.shape[0], 4096)
    norms = torch.cat([weight[i : i + 4096].double().norm(dim=1) for i in rows]).mul_(1 + 1e-6).float()
    return GreedyHead(
        exact=head,
        estimate=pack_linear_weight(weight, "batchgen", compute_dtype=torch.bfloat16),
        norms=norms,
        coef=_coef(head.in_features),
    )


def estimate_logits(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    """x's logits with bfloat16 operands and float32 sums, float32 [M, V]: within the bound of the
    module docstring of `linear(x, head.exact)`."""
    with _named("batchgen::greedy_estimate"):
        return linear(x, head.estimate)


def greedy_tokens(x: torch.Tensor, head: GreedyHead) -> torch.Tensor:
    """argmax(linear(x, head.exact), dim=-1) for x [M, K] float32, int64 [M]; see the module."""
    x = x.contiguous()
    estimates = estimate_logits(x, head)
    with _named("batchgen::greedy_screen"):
        tokens: torch.Tensor = load_cpu_kernel().greedy_screen(
            estimates, x, head.exact.packed, head.norms, head.coef, _MAX_CANDIDATES
        )
    undecided = (tokens < 0).nonzero().flatten()
    if undecided.numel():
        rows = x.index_select(0, undecided)
        tokens[undecided] = argmax(linear(rows, head.exact))
    return tokens
