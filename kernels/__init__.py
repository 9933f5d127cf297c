"""Attention over the paged KV cache and other fused ops, dispatched by device.

Triton kernels run on CUDA; on the CPU, compiled C++ kernels and linear layers with weights
packed once (float32), with the PyTorch path as the reference and the fallback. The engine calls only the functions
listed in `__all__`. This package imports torch (and triton lazily), nothing of batchgen.
"""

from __future__ import annotations

from .cpu_memory import keep_freed_memory
from .cpu_threads import OpenMPThreads, release_openmp_threads
from .dispatch import (
    Backend,
    RmsNormOutput,
    apply_token_bitmask,
    argmax,
    is_kv_cache_lazy,
    new_kv_cache,
    paged_attention,
    prepare_backend,
    resolve_backend,
    rms_norm,
    rotary_embedding,
    silu_and_mul,
    write_kv,
)
from .greedy_cpu import (
    GreedyHead,
    greedy_head_supported,
    greedy_screen_available,
    greedy_tokens,
    pack_greedy_head,
)
from .linear_cpu import (
    PackedLinear,
    batchgen_bf16_linear,
    bf16_linear_library,
    bf16_linear_supported,
    linear,
    pack_linear_weight,
    pack_silu_gate_up,
    packed_linear_library,
    packing_libraries,
    silu_gate_up,
)
from .metadata import AttentionMetadata
from .token_bitmask import unpack_bitmask

__all__ = [
    "AttentionMetadata",
    "Backend",
    "GreedyHead",
    "OpenMPThreads",
    "PackedLinear",
    "RmsNormOutput",
    "apply_token_bitmask",
    "argmax",
    "batchgen_bf16_linear",
    "bf16_linear_library",
    "bf16_linear_supported",
    "greedy_head_supported",
    "greedy_screen_available",
    "greedy_tokens",
    "is_kv_cache_lazy",
    "keep_freed_memory",
    "linear",
    "new_kv_cache",
    "pack_greedy_head",
    "pack_linear_weight",
    "pack_silu_gate_up",
    "packed_linear_library",
    "packing_libraries",
    "paged_attention",
    "prepare_backend",
    "release_openmp_threads",
    "resolve_backend",
    "rms_norm",
    "rotary_embedding",
    "silu_and_mul",
    "silu_gate_up",
    "unpack_bitmask",
    "write_kv",
]
