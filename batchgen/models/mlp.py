"""The feed-forward blocks: a gated dense MLP and a mixture of experts, over a flat batch.

Both take normed hidden states `[T, hidden]` and return `[T, hidden]`; they keep no state.
A gated MLP runs `down(act(gate(x)) * up(x))` with gate and up fused into one matrix
(`| gate | up |` rows). The mixture of experts routes each token to its top-k experts
(softmax over the router's logits in float32, top-k, optionally renormalised to sum 1), then
groups the (token, expert) pairs by expert so that each expert runs one gated-MLP GEMM pair over
all of its tokens of the step; the loop is over experts that got tokens, never over tokens:

    pairs sorted by expert: | e0: t3 t7 | e1: t0 | e4: t0 t3 t5 | ...    (top-k = 2)
                              one GEMM    one      one GEMM

and each token's output is the weighted sum of its experts' rows (`index_add_`).

Imports torch and `batchgen.kernels`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from batchgen.kernels import (
    Backend,
    PackedLinear,
    bf16_linear_library,
    linear,
    pack_silu_gate_up,
    packed_linear_library,
    silu_and_mul,
    silu_gate_up,
)

from .attention import Weight, pack

__all__ = ["DenseMLP", "MoEMLP", "gated_activation"]


def _gelu_tanh_and_mul(x: torch.Tensor, *, backend: Backend | None = None) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def gated_activation(name: str) -> Callable[..., torch.Tensor]:
    """`act(gate) * up` of a fused `[T, 2n]` for a `hidden_act` name; ValueError for others."""
    if name == "silu":
        silu: Callable[..., torch.Tensor] = silu_and_mul
        return silu
    if name == "gelu_pytorch_tanh":
        return _gelu_tanh_and_mul
    raise ValueError(f"unsupported activation {name!r} (silu, gelu_pytorch_tanh)")


class DenseMLP:
    """`down(act(gate(x)) * up(x))`; `gate_up` is the fused [2 * intermediate, hidden] matrix."""

    __slots__ = ("act", "down", "gate_up")

    def __init__(self, gate_up: Weight, down: Weight, act: str) -> None:
        self.gate_up = gate_up
        self.down = down
        self.act = gated_activation(act)

    def pack(self, compute_dtype: torch.dtype = torch.float32) -> None:
        """Pack both projections for the CPU; where batchgen's own kernel runs the linear layers
        (float32, or bfloat16 where its bfloat16 kernel is `bf16_linear_library`'s choice), a silu
        MLP's gate/up is packed for the fused `silu_gate_up` (the same bits, without writing and
        reading the [T, 2n] product: 68 ms of a 2,048-token prefill step)."""
        kernel_here = (
            packed_linear_library() == "batchgen" if compute_dtype == torch.float32 else bf16_linear_library() == "batchgen"
        )
        fused = self.act is silu_and_mul and isinstance(self.gate_up, torch.Tensor) and kernel_here
        self.gate_up = pack_silu_gate_up(self.gate_up, compute_dtype) if fused else pack(self.gate_up, compute_dtype)
        self.down = pack(self.down, compute_dtype)

    def forward(self, x: torch.Tensor, backend: Backend | None) -> torch.Tensor:
        gate_up = self.gate_up
        if isinstance(gate_up, PackedLinear) and gate_up.gated:
            hidden = silu_gate_up(x, gate_up)
        else:
            hidden = self.act(linear(x, gate_up), backend=backend)
        out: torch.Tensor = linear(hidden, self.down)
        return out


class MoEMLP:
    """Top-k routed experts, each a gated MLP (module docstring). `router`: [num_experts, hidden]."""

    __slots__ = ("act", "downs", "gate_ups", "renormalize", "router", "top_k")

    def __init__(
        self,
        router: torch.Tensor,
        gate_ups: list[Weight],
        downs: list[Weight],
        *,
        top_k: int,
        renormalize: bool,
        act: str,
    ) -> None:
        if len(gate_ups) != router.shape[0] or len(downs) != router.shape[0]:
            raise ValueError(f"{router.shape[0]} router rows for {len(gate_ups)} / {len(downs)} experts")
        self.router = router
        self.gate_ups = gate_ups
        self.downs = downs
        self.top_k = top_k
        self.renormalize = renormalize
        self.act = gated_activation(act)

    @property
    def num_experts(self) -> int:
        return len(self.gate_ups)

    def pack(self, compute_dtype: torch.dtype = torch.float32) -> None:
        self.gate_ups = [pack(w, compute_dtype) for w in self.gate_ups]
        self.downs = [pack(w, compute_dtype) for w in self.downs]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, top_k] in x's dtype, expert ids int64 [T, top_k]) of each token."""
        probs = torch.softmax(F.linear(x, self.router).float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor, backend: Backend | None) -> torch.Tensor:
        weights, ids = self.route(x)
        flat_ids = ids.reshape(-1)
        # Stable: within one expert, pairs stay in token order.
        order = torch.argsort(flat_ids, stable=True)
        token_idx = order // self.top_k
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        grouped = x.index_select(0, token_idx)
        out_rows = torch.empty_like(grouped)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            rows = grouped[start : start + count]
            hidden = self.act(linear(rows, self.gate_ups[expert]), backend=backend)
            out_rows[start : start + count] = linear(hidden, self.downs[expert])
            start += count
        out_rows *= weights.reshape(-1).index_select(0, order).unsqueeze(1)
        return torch.zeros_like(x).index_add_(0, token_idx, out_rows)
