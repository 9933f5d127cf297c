"""Compiled CPU paged attention, RMSNorm, rotary embedding, SiLU-and-multiply, KV write, argmax and
grammar bitmasks (float32): a C++ extension built once by torch's extension tools.

`cpu_attention.cpp` reads K/V in place from the block pool (in its own layout: `cpu_kv_cache`)
with an online softmax, parallel
over (sequence, KV head, query tile) on torch's own OpenMP threads, with a tile path for prefill
chunks (`cpu_attention_tile.h`: AVX-512, or the same code over AVX2 halves, `cpu_vec16_avx2.h`)
and decode rows in slices that read shared blocks once;
see the comments there. The small ops of `cpu_small_ops.h` (RMSNorm with the residual add,
rotary embedding, SiLU-and-multiply, KV write, argmax) each replace one or more PyTorch ops whose
per-call cost dominates at decode sizes.
The first call compiles it with the system C++ compiler (about half a minute) into torch's
extension cache (`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions); later processes
load the cached library in well under a second. The build is for this machine's CPU
(-march=native); the cache key includes the source, the flags and the CPU's feature flags.

`attention_torch.py` and the PyTorch ops in `dispatch.py` stay the references the kernels are
tested against, and the fallback when
no compiler is present (`is_cpu_kernel_available`). Imports torch only.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from .cpu_memory import lazy_zeros
from .metadata import AttentionMetadata

__all__ = [
    "build_cpu_kernel_variant",
    "cpu_kv_cache",
    "is_cpu_kernel_available",
    "is_cpu_kv_layout",
    "load_cpu_kernel",
    "paged_attention_cpu",
    "rms_norm_cpu",
    "rotary_embedding_cpu",
    "silu_and_mul_cpu",
]

_SOURCE = Path(__file__).with_name("cpu_attention.cpp")
_HEADERS = tuple(Path(__file__).with_name(n) for n in ("cpu_attention_tile.h", "cpu_greedy.h", "cpu_greedy_int8.h", "cpu_linear.h", "cpu_small_ops.h", "cpu_vec16_avx2.h"))
# No FMA contraction: the rotary embedding must round as the PyTorch path does (the attention
# kernel writes its FMAs explicitly).
_CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-ffp-contract=off")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


@functools.cache
def load_cpu_kernel() -> ModuleType:
    """The compiled extension (built on first use, then loaded from torch's cache).

    Raises RuntimeError (from torch's builder) when there is no working C++ compiler.
    """
    return build_cpu_kernel_variant()


def build_cpu_kernel_variant(
    defines: tuple[str, ...] = (), include_dirs: tuple[Path, ...] = (), name: str = "batchgen_cpu_attention"
) -> ModuleType:
    """Build (or load from torch's cache) the extension with extra `-D` defines and include
    folders; no extras gives the production build, `load_cpu_kernel`'s. Tests build the
    variant with `BATCHGEN_EMULATE_AVX512` (the AVX-512 paths on a CPU without AVX-512) this way.

    Raises RuntimeError (from torch's builder) when the build fails.
    """
    from torch.utils.cpp_extension import load

    extra = tuple(f"-D{d}" for d in defines)
    full_name = _extension_name(defines, include_dirs, name)
    with _builder_lock(full_name):
        module: ModuleType = load(
            name=full_name,
            sources=[str(_SOURCE)],
            extra_cflags=[*_CFLAGS, *extra],
            extra_include_paths=[str(p) for p in include_dirs],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    return module


def _extension_name(defines: tuple[str, ...], include_dirs: tuple[Path, ...], name: str) -> str:
    """`name` and a key of everything the build depends on: torch's extension name, and its
    build folder's."""
    extra = tuple(f"-D{d}" for d in defines)
    headers = sorted(p for folder in include_dirs for p in folder.glob("*.h"))
    # The source folder is in the key too: torch rebuilds an extension whose source paths changed,
    # so two checkouts sharing one name would rebuild it in turn (half a minute each time).
    key = hashlib.sha256(
        b"".join(p.read_bytes() for p in (_SOURCE, *_HEADERS, *headers))
        + " ".join(_CFLAGS + extra).encode()
        + _cpu_flags().encode()
        + torch.__version__.encode()
        + str(_SOURCE.parent.resolve()).encode()
    ).hexdigest()[:12]
    return f"{name}_{key}"


@contextlib.contextmanager
def _builder_lock(name: str) -> Iterator[None]:
    """Hold an exclusive `flock` on the extension's build folder while torch builds or loads it,
    and clear a `lock` file that torch's own lock left there.

    torch's `load()` takes a lock file in the build folder for every load (created with O_EXCL,
    waited on by polling until it is gone) and removes it when done. A process killed inside
    `load()` leaves the file, and every later load waits on it forever: a job or a test run that
    hangs, with nothing said. An `flock` is released by the kernel when its process dies, so
    while this one is held no other batchgen process is inside `load()` for this folder, and a
    lock file found then is such a leftover. Where flock or torch's folder layout is not there,
    only torch's lock is used."""
    try:
        import fcntl

        from torch.utils.cpp_extension import _get_build_directory

        folder = Path(_get_build_directory(name, False))
    except (ImportError, AttributeError, OSError):
        yield
        return
    with open(folder / "batchgen.flock", "a") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(guard, fcntl.LOCK_UN)


@functools.cache
def is_cpu_kernel_available() -> bool:
    """True when a C++ compiler and ninja are present and the extension builds or loads."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return False
    try:
        load_cpu_kernel()
    except (RuntimeError, OSError, ImportError):
        return False
    return True


def _named(name: str) -> contextlib.AbstractContextManager[object]:
    """A named profiler range while a profiler runs; nothing otherwise (a range costs about 11 us,
    over 1 ms a decode step at 121 calls)."""
    if torch._C._autograd._profiler_enabled():
        return torch.profiler.record_function(name)
    return contextlib.nullcontext()


def cpu_kv_cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, *, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's zeroed K and V pools in the compiled kernel's layout (CPU).

    Both are `[num_blocks, block_size, num_kv_heads, head_dim]` by shape, as every backend's pools
    are, but strided views: K is stored `[num_blocks, num_kv_heads, head_dim, block_size]` (each
    block's K transposed per head, so that the kernel's q.k needs no horizontal sums), V
    `[num_blocks, num_kv_heads, block_size, head_dim]`. Indexing, copies and the PyTorch path see
    ordinary tensors; `paged_attention_cpu` requires this layout.
    """
    # committed page by page as blocks are written (`lazy_zeros`), not all at once
    k = lazy_zeros((num_blocks, num_kv_heads, head_dim, block_size), dtype).permute(0, 3, 1, 2)
    v = lazy_zeros((num_blocks, num_kv_heads, block_size, head_dim), dtype).permute(0, 2, 1, 3)
    return k, v


def is_cpu_kv_layout(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """True when k_cache/v_cache are laid out as `cpu_kv_cache` makes them."""
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        return False
    _, bs, kvh, d = k_cache.shape
    return k_cache.stride() == (kvh * d * bs, 1, d * bs, bs) and v_cache.stride() == (kvh * bs * d, d, bs * d, 1)


def paged_attention_cpu(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Attention of every query token over its sequence's cached K/V (float32, CPU), with an
    optional sliding window and logit soft cap (as `dispatch.paged_attention`; blocks wholly
    outside a query's window are not read).

    query: [num_tokens, num_heads, head_dim], read in place where each token's heads are one
    contiguous run (a view into a fused q/k/v output), else copied by the kernel; returns a new contiguous
    tensor of that shape. Reads the caches only, which must be laid out as `cpu_kv_cache` makes
    them. Raises RuntimeError for other dtypes or another layout, and (naming the sequence) for
    metadata that would read outside the pools or the query: a block id a sequence reads outside [0, num_blocks), a
    decreasing `query_start_loc` or one past the query's tokens, more query tokens than
    `seq_lens` holds, a `seq_lens` past the block table, or tensors of mismatched lengths. The
    kernel checks these where it reads them (about 3 us per call for a batch-64 decode step),
    and a window below 1 or a cap that is not positive and finite.
    """
    kernel = load_cpu_kernel()
    # A named range, so that torch.profiler shows the kernel's time (jobs/bench/profile_step.py).
    with _named("batchgen::paged_attention_cpu"):
        out: torch.Tensor = kernel.paged_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            scale,
            sliding_window,
            logits_soft_cap,
        )
    return out


def rms_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight * h / rms(h), h) with h = x + residual (float32, CPU); see dispatch.rms_norm."""
    with _named("batchgen::rms_norm_cpu"):
        out, h = load_cpu_kernel().rms_norm(
            x.contiguous(), None if residual is None else residual.contiguous(), weight.contiguous(), eps
        )
    return out, h


def rotary_embedding_cpu(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_cache: torch.Tensor,
    sin_cache: torch.Tensor,
) -> None:
    """Rotates query and key in place (float32, CPU); see dispatch.rotary_embedding."""
    with _named("batchgen::rotary_embedding_cpu"):
        load_cpu_kernel().rotary_embedding(positions, query, key, cos_cache.contiguous(), sin_cache.contiguous())


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused x = [gate | up] ([T, 2n], float32, CPU); see dispatch.silu_and_mul."""
    with _named("batchgen::silu_and_mul_cpu"):
        out: torch.Tensor = load_cpu_kernel().silu_and_mul(x.contiguous())
    return out


def is_cpu_kernel_loaded() -> bool:
    """True once this process has built or loaded the extension (never starts a build)."""
    return load_cpu_kernel.cache_info().currsize > 0


def argmax_cpu(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of a non-empty [T, V] (float32, CPU), int64 [T]; see dispatch.argmax."""
    with _named("batchgen::argmax_cpu"):
        out: torch.Tensor = load_cpu_kernel().argmax_rows(x.contiguous())
    return out


def apply_token_bitmask_cpu(x: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Grammar bitmasks applied in place to rows of a contiguous float32 [T, V]; bool [k], True
    for a row left with nothing above -inf. See dispatch.apply_token_bitmask."""
    with _named("batchgen::apply_token_bitmask_cpu"):
        out: torch.Tensor = load_cpu_kernel().apply_token_bitmask(x, rows.contiguous(), bitmask.contiguous())
    return out


def write_kv_cpu(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Stores each token's K/V at its pool slot, skipping -1 (float32, CPU); see dispatch.write_kv."""
    with _named("batchgen::write_kv_cpu"):
        load_cpu_kernel().write_kv(key, value, k_cache, v_cache, slot_mapping.long())
