"""One entry point per op; picks the Triton, compiled-CPU or PyTorch implementation.

`backend` is "torch", "triton", "cpu" or None (None: Triton on CUDA tensors; on CPU the compiled
kernels for float32 when they build, PyTorch for everything else). "cpu" covers attention,
RMSNorm, the rotary embedding and SiLU-and-multiply (float32; other dtypes take the PyTorch path);
the KV write runs its PyTorch path there.
"triton" on CPU tensors works only under the Triton interpreter (TRITON_INTERPRET=1 set before
the first Triton call); that is how CI tests the kernels. Triton modules are imported lazily, on
the first Triton call, so importing this package needs no triton and costs nothing on CPU.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from .attention_cpu import (
    apply_token_bitmask_cpu,
    argmax_cpu,
    cpu_kv_cache,
    is_cpu_kernel_available,
    is_cpu_kernel_loaded,
    is_cpu_kv_layout,
    load_cpu_kernel,
    paged_attention_cpu,
    rms_norm_cpu,
    rotary_embedding_cpu,
    silu_and_mul_cpu,
    write_kv_cpu,
)
from .attention_torch import paged_attention_torch, write_kv_torch
from .cpu_memory import lazy_zeros
from .metadata import AttentionMetadata
from .token_bitmask import apply_token_bitmask_torch, check_token_bitmask_args

__all__ = [
    "Backend",
    "RmsNormOutput",
    "apply_token_bitmask",
    "argmax",
    "is_kv_cache_lazy",
    "new_kv_cache",
    "paged_attention",
    "prepare_backend",
    "resolve_backend",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "write_kv",
]

Backend = Literal["torch", "triton", "cpu"]


def resolve_backend(backend: Backend | None, device: torch.device) -> Backend:
    """The backend to use for tensors on `device`; raises ValueError for an unknown name.

    None on a CPU device gives "cpu" when the compiled kernel builds (first call: a compile),
    else "torch".
    """
    if backend is None:
        if device.type == "cuda":
            return "triton"
        return "cpu" if device.type == "cpu" and is_cpu_kernel_available() else "torch"
    if backend not in ("torch", "triton", "cpu"):
        raise ValueError(f"attention backend must be 'torch', 'triton' or 'cpu', got {backend!r}")
    return backend


def prepare_backend(backend: Backend | None, device: torch.device) -> None:
    """Build or load now what `backend` on `device` needs, so that a first step does not pay it:
    the compiled CPU kernel (a compile of about half a minute the first time on a machine).

    Raises RuntimeError for an explicit "cpu" when the kernel cannot be built.
    """
    if resolve_backend(backend, device) == "cpu":
        load_cpu_kernel()


def is_kv_cache_lazy(device: torch.device) -> bool:
    """Whether `new_kv_cache` on `device` commits memory as blocks are first written (the CPU:
    each pool is an anonymous mapping, `lazy_zeros`) rather than all at allocation (CUDA)."""
    return device.type == "cpu"


def new_kv_cache(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    dtype: torch.dtype,
    device: torch.device,
    backend: Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's zeroed K and V pools, `[num_blocks, block_size, num_kv_heads, head_dim]` each,
    laid out for the backend that will read them: the compiled CPU kernel's layout where it runs
    (CPU, float32; see `cpu_kv_cache`), contiguous everywhere else."""
    if device.type == "cpu" and dtype == torch.float32 and resolve_backend(backend, device) == "cpu":
        return cpu_kv_cache(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    if is_kv_cache_lazy(device):  # pages committed as blocks are first written
        return lazy_zeros(shape, dtype), lazy_zeros(shape, dtype)
    return torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: Backend | None = None,
) -> None:
    """Write the step's K/V ([num_tokens, num_kv_heads, head_dim]) into the pool at slot_mapping.

    Mutates k_cache/v_cache (any layout on CPU). Triton and the compiled CPU op (float32) skip
    slot -1 (padding tokens); the PyTorch path needs every slot valid (IndexError on -1).
    """
    resolved = resolve_backend(backend, key.device)
    if resolved == "triton":
        from .triton_kv import write_kv_triton  # lazy: triton may be missing, and costs on CPU

        write_kv_triton(key, value, k_cache, v_cache, slot_mapping)
        return
    if resolved == "cpu" and _all_float32(key, value, k_cache, v_cache):
        write_kv_cpu(key, value, k_cache, v_cache, slot_mapping)
        return
    write_kv_torch(key, value, k_cache, v_cache, slot_mapping)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    backend: Backend | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Attention for a flat batch of decode tokens and prefill chunks; see metadata.py.

    query: [num_tokens, num_heads, head_dim]; returns a new tensor of its shape and dtype.
    sliding_window: each query sees the last `sliding_window` positions, its own included (keys at
    positions > query position - sliding_window; HF/vLLM semantics); None = all earlier keys.
    logits_soft_cap: scores become cap * tanh(scores / cap), after `scale`, before the softmax.
    Raises ValueError for a window below 1 or a cap that is not a positive finite number. The
    Triton path needs query and caches of one dtype (fp16/bf16/fp32) and a head_dim of at most
    256, and raises ValueError otherwise.
    """
    _check_options(sliding_window, logits_soft_cap)
    resolved = resolve_backend(backend, query.device)
    if resolved == "triton":
        from .triton_attention import paged_attention_triton

        return paged_attention_triton(
            query, k_cache, v_cache, meta, scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
        )
    # The compiled kernel reads float32 pools in its own layout (new_kv_cache makes them): None
    # falls back to PyTorch for anything else, an explicit "cpu" raises (RuntimeError from the
    # kernel).
    fits_kernel = query.dtype == torch.float32 == k_cache.dtype and is_cpu_kv_layout(k_cache, v_cache)
    if resolved == "cpu" and (backend == "cpu" or fits_kernel):
        return paged_attention_cpu(
            query, k_cache, v_cache, meta, scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
        )
    return paged_attention_torch(
        query, k_cache, v_cache, meta, scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )


def _check_options(sliding_window: int | None, logits_soft_cap: float | None) -> None:
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1
    ):
        raise ValueError(f"sliding_window must be an int >= 1 or None, got {sliding_window!r}")
    if logits_soft_cap is not None and not (
        isinstance(logits_soft_cap, int | float) and 0.0 < logits_soft_cap < float("inf")
    ):
        raise ValueError(f"logits_soft_cap must be a positive finite number or None, got {logits_soft_cap!r}")


def _all_float32(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.dtype == torch.float32 for t in tensors)


class RmsNormOutput(NamedTuple):
    """`out` = the normalised hidden states; `residual` = the input to the next residual add."""

    out: torch.Tensor
    residual: torch.Tensor


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    backend: Backend | None = None,
) -> RmsNormOutput:
    """RMSNorm of x [num_tokens, hidden], after adding residual when given (Hugging Face rounding).

    h = x + residual (in x.dtype; h = x without a residual); out = weight * (h / rms(h)).to(x.dtype),
    statistics in fp32. Returns (out, h); mutates nothing. out has x's dtype.
    """
    resolved = resolve_backend(backend, x.device)
    if resolved == "triton":
        from .triton_norm_rope import rms_norm_triton

        return RmsNormOutput(*rms_norm_triton(x, weight, eps, residual))
    if resolved == "cpu" and _all_float32(x, weight, residual):
        return RmsNormOutput(*rms_norm_cpu(x, weight, eps, residual))
    h = x if residual is None else x + residual
    hf = h.float()
    normed = hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return RmsNormOutput((weight * normed.to(x.dtype)).to(x.dtype), h)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of a 2-D x (first index on ties, a NaN wins), int64.

    The compiled CPU op for float32 once this process has loaded the CPU kernel (a CPU model
    with the compiled backend loads it when it is built); this never starts a build.
    """
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[1] > 0 and is_cpu_kernel_loaded():
        return argmax_cpu(x)
    return torch.argmax(x, dim=-1)


def apply_token_bitmask(x: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place: every token of row rows[i] of `x` [T, V] that bitmask[i] (int32 [k, words],
    bit j of word w allows token 32 w + j; tokens past 32 * words are banned) bans becomes -inf.
    Returns bool [k]: True where that row has no logit above -inf left.

    The compiled CPU op (one pass over the packed words) for a contiguous float32 x once this
    process has loaded the CPU kernel; `token_bitmask.apply_token_bitmask_torch` otherwise.
    """
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous() and is_cpu_kernel_loaded():
        check_token_bitmask_args(x, rows, bitmask)
        return apply_token_bitmask_cpu(x, rows, bitmask.to(x.device))
    return apply_token_bitmask_torch(x, rows, bitmask)


def silu_and_mul(x: torch.Tensor, *, backend: Backend | None = None) -> torch.Tensor:
    """silu(gate) * up for the fused projection x = [gate | up] ([num_tokens, 2 * n]); returns a
    new [num_tokens, n] tensor. The compiled CPU op for float32 on "cpu"; PyTorch otherwise
    (CUDA included: there the two ops cost little beside the GEMMs)."""
    if resolve_backend(backend, x.device) == "cpu" and x.dtype == torch.float32:
        return silu_and_mul_cpu(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
    *,
    backend: Backend | None = None,
) -> None:
    """Rotate query [T, H, D] and key [T, KVH, D] in place ("rotate_half" form, whole head).

    positions: int [T]; cos_cache/sin_cache: [max_positions, D // 2], usually fp32. Computed in
    fp32, rounded once to the q/k dtype. Mutates query and key (views into a fused qkv are fine).
    """
    resolved = resolve_backend(backend, query.device)
    if resolved == "triton":
        from .triton_norm_rope import rotary_embedding_triton

        rotary_embedding_triton(positions, query, key, cos_cache, sin_cache)
        return
    if resolved == "cpu" and _all_float32(query, key, cos_cache, sin_cache):
        rotary_embedding_cpu(positions, query, key, cos_cache, sin_cache)
        return
    half = query.shape[-1] // 2
    cos = cos_cache.index_select(0, positions).float().unsqueeze(1)  # [T, 1, D/2]
    sin = sin_cache.index_select(0, positions).float().unsqueeze(1)
    for x in (query, key):
        x1, x2 = x[..., :half].float(), x[..., half:].float()
        x.copy_(torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1))
