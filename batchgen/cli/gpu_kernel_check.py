"""The first measuring stage of `batchgen gpu-check`: every Triton kernel once at the built-in
model's production shapes, in bfloat16 and float32, against the PyTorch path.

For each kernel and dtype: the seconds of the first call (compile on a cold cache plus one launch,
synchronised), the median milliseconds of warm calls (CUDA only), and the largest absolute
difference from the PyTorch path on the same inputs, with the tolerance it is judged by
(`atol + rtol * max |reference|`; the KV write must be exact). Each case runs in its own `try`:
a kernel that fails to compile is recorded and the others still run.

`recompile_probe` calls the attention kernel at block-table widths and sequence counts that a
real run passes through (1, multiples of 16 and their neighbours) and counts the compiled
variants it adds: with `num_seqs` and `stride_bt` unspecialised, none after the first.

Production shapes (SmolLM2-135M): 9 query heads, 3 KV heads, head_dim 64, blocks of 16 tokens,
hidden size 576. `KernelSizes.tiny()` is for a CPU run under the Triton interpreter (tests).
Imports torch and batchgen.kernels (triton through them).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from batchgen.cli.gpu_kernels import Shape, build_paged_batch, time_ms
from batchgen.kernels import Backend, paged_attention, rms_norm, rotary_embedding, write_kv

__all__ = ["KernelCase", "KernelSizes", "check_kernels", "recompile_probe"]

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, HIDDEN = 9, 3, 64, 16, 576
_TOLERANCE = {torch.bfloat16: (3e-2, 1.6e-2), torch.float32: (1e-5, 1e-5)}
_L2_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class KernelSizes:
    """Problem sizes: decode (seqs x context), prefill (seqs x query tokens over a cached
    context), and the token count of the per-token kernels."""

    decode_seqs: int = 64
    decode_context: int = 511
    prefill_seqs: int = 4
    prefill_query: int = 128
    prefill_context: int = 256
    num_tokens: int = 256

    @classmethod
    def tiny(cls) -> KernelSizes:
        return cls(decode_seqs=2, decode_context=20, prefill_seqs=1, prefill_query=5, prefill_context=3, num_tokens=4)


@dataclass(frozen=True, slots=True)
class KernelCase:
    kernel: str
    dtype: str
    first_call_s: float | None
    warm_ms: float | None
    max_abs_err: float | None
    max_abs_ref: float | None
    tolerance: float | None
    ok: bool
    error: str | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _max_err(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> tuple[float, float]:
    err = max(float((a.float() - e.float()).abs().max()) for a, e in zip(actual, expected, strict=True))
    ref = max(float(e.float().abs().max()) for e in expected)
    return err, ref


# A case: (name, dtype) -> (run Triton once returning outputs, run PyTorch returning outputs,
# whether the comparison must be exact).
_Case = tuple[Callable[[], list[torch.Tensor]], Callable[[], list[torch.Tensor]], bool]


def _attention_case(shape: Shape, dtype: torch.dtype, device: torch.device) -> _Case:
    query, k_cache, v_cache, meta, _, _ = build_paged_batch(shape, dtype, device, BLOCK_SIZE)
    scale = 1.0 / math.sqrt(shape.head_dim)
    return (
        lambda: [paged_attention(query, k_cache, v_cache, meta, scale, backend="triton")],
        lambda: [paged_attention(query, k_cache, v_cache, meta, scale, backend="torch")],
        False,
    )


def _write_kv_case(num_tokens: int, dtype: torch.dtype, device: torch.device) -> _Case:
    num_blocks = -(-num_tokens // BLOCK_SIZE) * 2 + 1
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dtype)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * BLOCK_SIZE, device=device)[:num_tokens]
    pool = torch.zeros(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, device=device, dtype=dtype)

    def run(backend: Backend) -> list[torch.Tensor]:
        k_cache, v_cache = pool.clone(), pool.clone()
        write_kv(key, value, k_cache, v_cache, slots, backend=backend)
        return [k_cache, v_cache]

    return (lambda: run("triton"), lambda: run("torch"), True)


def _rms_norm_case(num_tokens: int, dtype: torch.dtype, device: torch.device) -> _Case:
    x = (3 * torch.randn(num_tokens, HIDDEN, device=device)).to(dtype)
    residual = torch.randn(num_tokens, HIDDEN, device=device).to(dtype)
    weight = (1 + 0.1 * torch.randn(HIDDEN, device=device)).to(dtype)

    def run(backend: Backend) -> list[torch.Tensor]:
        return list(rms_norm(x, weight, 1e-5, residual, backend=backend))

    return (lambda: run("triton"), lambda: run("torch"), False)


def _rotary_case(num_tokens: int, dtype: torch.dtype, device: torch.device) -> _Case:
    max_positions = 2048
    inv_freq = 1.0 / (100000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
    cos, sin = freqs.cos().to(device), freqs.sin().to(device)
    positions = torch.randint(0, max_positions, (num_tokens,), device=device)
    query = torch.randn(num_tokens, NUM_HEADS, HEAD_DIM, device=device).to(dtype)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM, device=device).to(dtype)

    def run(backend: Backend) -> list[torch.Tensor]:
        q, k = query.clone(), key.clone()
        rotary_embedding(positions, q, k, cos, sin, backend=backend)
        return [q, k]

    return (lambda: run("triton"), lambda: run("torch"), False)


def _cases(sizes: KernelSizes, dtype: torch.dtype, device: torch.device) -> dict[str, Callable[[], _Case]]:
    decode = Shape("decode", sizes.decode_seqs, 1, sizes.decode_context, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
    prefill = Shape(
        "prefill", sizes.prefill_seqs, sizes.prefill_query, sizes.prefill_context, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM
    )
    return {
        f"paged_attention decode {decode.num_seqs}x{decode.context_len + 1}": lambda: _attention_case(decode, dtype, device),
        f"paged_attention prefill {prefill.num_seqs}x{prefill.query_len} over {prefill.context_len}": lambda: _attention_case(
            prefill, dtype, device
        ),
        f"write_kv {sizes.num_tokens} tokens": lambda: _write_kv_case(sizes.num_tokens, dtype, device),
        f"rms_norm+residual {sizes.num_tokens}x{HIDDEN}": lambda: _rms_norm_case(sizes.num_tokens, dtype, device),
        f"rotary {sizes.num_tokens} tokens": lambda: _rotary_case(sizes.num_tokens, dtype, device),
    }


def _run_case(
    name: str, dtype: torch.dtype, make: Callable[[], _Case], device: torch.device, warmup: int, iters: int
) -> KernelCase:
    dtype_name = str(dtype).removeprefix("torch.")
    first_s: float | None = None
    try:
        triton_fn, torch_fn, exact = make()
        _sync(device)
        start = time.perf_counter()
        actual = triton_fn()
        _sync(device)
        first_s = time.perf_counter() - start
        err, ref = _max_err(actual, torch_fn())
        atol, rtol = _TOLERANCE[dtype]
        tolerance = 0.0 if exact else atol + rtol * ref
        warm_ms = None
        if device.type == "cuda":
            flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
            warm_ms = round(time_ms(triton_fn, flush, warmup, iters), 4)
        return KernelCase(name, dtype_name, round(first_s, 3), warm_ms, err, ref, tolerance, err <= tolerance)
    except Exception as exc:  # one kernel's failure is its result; the other cases still run
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        return KernelCase(name, dtype_name, first_s, None, None, None, None, False, text[-2000:])


def check_kernels(
    device: torch.device,
    *,
    sizes: KernelSizes = KernelSizes(),
    dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float32),
    warmup: int = 3,
    iters: int = 10,
    log: Callable[[str], None] = print,
) -> list[KernelCase]:
    """Every kernel case for every dtype, in order; see the module docstring. Seeded (0)."""
    torch.manual_seed(0)
    results = []
    for dtype in dtypes:
        for name, make in _cases(sizes, dtype, device).items():
            case = _run_case(name, dtype, make, device, warmup, iters)
            log(
                f"  {case.kernel:<44} {case.dtype:<9} first {case.first_call_s}s warm {case.warm_ms} ms "
                f"err {case.max_abs_err} (tol {case.tolerance}) {'ok' if case.ok else 'FAILED ' + str(case.error)}"
            )
            results.append(case)
    return results


def _compiled_variants(kernel: object) -> int | None:
    """How many specialisations of a JIT kernel are compiled (None where Triton keeps no such
    cache: under the interpreter, or another Triton version)."""
    caches = getattr(kernel, "device_caches", None)
    if not isinstance(caches, dict):
        return None
    try:
        return sum(len(entry[0]) for entry in caches.values())
    except (TypeError, IndexError):
        return None


def recompile_probe(device: torch.device, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Decode attention at (num_seqs, block-table width) pairs a run passes through; the compiled
    variants before and after each call, and each call's seconds (synchronised)."""
    from batchgen.kernels import triton_attention

    kernel = triton_attention._paged_attention_kernel
    calls = []
    for num_seqs, width in ((3, 2), (1, 1), (16, 16), (17, 17), (5, 32), (5, 33), (32, 3)):
        shape = Shape("decode", num_seqs, 1, width * BLOCK_SIZE - 1, NUM_HEADS, NUM_KV_HEADS, HEAD_DIM)
        query, k_cache, v_cache, meta, _, _ = build_paged_batch(shape, dtype, device, BLOCK_SIZE)
        before = _compiled_variants(kernel)
        _sync(device)
        start = time.perf_counter()
        paged_attention(query, k_cache, v_cache, meta, 0.125, backend="triton")
        _sync(device)
        calls.append(
            {
                "num_seqs": num_seqs,
                "block_table_width": int(meta.block_tables.shape[1]),
                "seconds": round(time.perf_counter() - start, 4),
                "variants_before": before,
                "variants_after": _compiled_variants(kernel),
            }
        )
    first, last = calls[0]["variants_after"], calls[-1]["variants_after"]
    added = None if first is None or last is None else last - first
    return {"dtype": str(dtype).removeprefix("torch."), "calls": calls, "variants_added_after_first": added}
