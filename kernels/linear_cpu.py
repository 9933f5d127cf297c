"""Linear layers through oneDNN with each weight packed once at load (float32, CPU).

`F.linear` hands every call to MKL's sgemm with the weight in its plain [out, in] layout; at
decode batch sizes (tens of rows) that reaches 130-190 GFLOP/s on this project's 2-core machine.
oneDNN with the weight reordered once into its blocked layout reaches 200-250 at the same sizes
(`jobs/bench/profile_step.py` names these calls `mkldnn::_linear_pointwise`), and about the same
as MKL for prefill-sized inputs. These are the ops PyTorch's own CPU compiler (inductor with
freezing) uses for linear layers; the packed tensor is opaque (layout torch._mkldnn).

`linear` takes a plain or a packed weight, so the model calls one function; `F.linear` on plain
weights stays the reference path (attention backend "torch"). Rounding differs from MKL's in the
last bits (another summation order). Imports torch only.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

__all__ = ["is_onednn_linear_available", "linear", "pack_linear_weight"]

# The row count oneDNN tunes the packed layout for; the packed weight serves any row count.
_PACK_ROWS = 64


@functools.cache
def is_onednn_linear_available() -> bool:
    """True when this torch build has oneDNN and its packed-linear ops."""
    ops = torch.ops.mkldnn
    return bool(torch.backends.mkldnn.is_available()) and all(  # type: ignore[no-untyped-call]
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    )


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` ([out, in], float32, CPU) reordered for oneDNN; `linear` takes the result."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.dim() != 2:
        raise ValueError(f"pack_linear_weight takes a 2-D float32 CPU tensor, got {weight.dtype} {tuple(weight.shape)}")
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _PACK_ROWS)
    return packed


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, for a plain weight or one from `pack_linear_weight`."""
    if weight.is_mkldnn:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
        return out
    return F.linear(x, weight, bias)
