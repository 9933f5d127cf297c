"""The kernel half of `batchgen gpu-check`: the compiled kernel tests on the real device, and
attention timings.

- `run_kernel_tests`: pytest over the test files it is given (gpu-check: the Triton ones), `gpu`-marked
  tests included, with BATCHGEN_REAL_GPU=1 (so tests/conftest.py leaves TRITON_INTERPRET unset
  and every Triton test runs compiled, on CUDA tensors), in a subprocess with a timeout; the log
  goes to DIR/pytest_kernels.log. The CPU C++ kernel's tests stay out: building that kernel
  costs a minute of device time and tells nothing about the GPU.
- `build_paged_batch`, `time_ms`: a paged batch with blocks scattered through the pool, and CUDA
  event timing, shared with `gpu_kernel_check`.
- `bench_shape`: Triton paged attention against PyTorch SDPA over K/V already gathered into dense
  tensors (the best case for PyTorch: no gather in the timing) and against the whole PyTorch
  paged path (gather included), for decode and prefill shapes, bf16. torch.cuda.Event timing
  after warmup, the L2 cache flushed before each timed call; median per call, launch included.
"""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from batchgen.kernels import AttentionMetadata

__all__ = [
    "Shape",
    "Timing",
    "bench_shape",
    "bench_shapes",
    "build_paged_batch",
    "kernel_test_command",
    "kernel_test_env",
    "print_timings",
    "run_kernel_tests",
    "time_ms",
]

_REPO_ROOT = Path(__file__).resolve().parents[2]
_L2_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True, slots=True)
class Shape:
    kind: str  # "decode" or "prefill"
    num_seqs: int
    query_len: int  # tokens per sequence this step
    context_len: int  # cached tokens before this step
    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(slots=True)
class Timing:
    shape: Shape
    triton_ms: float | None = None
    sdpa_ms: float | None = None
    torch_path_ms: float | None = None
    sdpa_variant: str | None = None
    max_abs_err_vs_sdpa: float | None = None
    kv_gb_per_s: float | None = None  # decode: K/V bytes read by the Triton kernel per second
    tflops: float | None = None  # prefill: attention FLOPs per second of the Triton kernel
    errors: list[str] = field(default_factory=list)


def bench_shapes() -> list[Shape]:
    heads = [(9, 3, 64), (32, 8, 128)]
    decode = [
        Shape("decode", seqs, 1, ctx - 1, h, kv, d)
        for h, kv, d in heads
        for seqs in (64, 256)
        for ctx in (512, 2048)
    ]
    prefill = [
        Shape("prefill", 8, 512, cached, h, kv, d) for h, kv, d in heads for cached in (0, 1024)
    ]
    return decode + prefill


def build_paged_batch(
    shape: Shape, dtype: torch.dtype, dev: torch.device, block_size: int = 16
) -> tuple[Any, ...]:
    """Query, pool (blocks scattered at random), metadata and dense gathered K/V [B, KVH, L, D]."""
    seq_len = shape.context_len + shape.query_len
    blocks_per_seq = math.ceil(seq_len / block_size)
    num_blocks = shape.num_seqs * blocks_per_seq + 1
    perm = torch.randperm(num_blocks, device=dev)[: shape.num_seqs * blocks_per_seq]
    block_tables = perm.view(shape.num_seqs, blocks_per_seq).to(torch.int32)
    pool_shape = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(pool_shape, device=dev, dtype=dtype)
    v_cache = torch.randn(pool_shape, device=dev, dtype=dtype)
    num_tokens = shape.num_seqs * shape.query_len
    query = torch.randn(num_tokens, shape.num_heads, shape.head_dim, device=dev, dtype=dtype)
    positions = torch.arange(shape.context_len, seq_len, device=dev)
    slots = block_tables[:, positions // block_size].long() * block_size + positions % block_size
    meta = AttentionMetadata(
        query_start_loc=torch.arange(
            0, num_tokens + 1, shape.query_len, device=dev, dtype=torch.int32
        ),
        seq_lens=torch.full((shape.num_seqs,), seq_len, device=dev, dtype=torch.int32),
        block_tables=block_tables,
        slot_mapping=slots.reshape(-1),
        query_lens_host=(shape.query_len,) * shape.num_seqs,
        seq_lens_host=(seq_len,) * shape.num_seqs,
        max_query_len=shape.query_len,
        max_seq_len=seq_len,
    )
    tables = block_tables.long()
    dense_k = k_cache[tables].reshape(shape.num_seqs, -1, shape.num_kv_heads, shape.head_dim)
    dense_v = v_cache[tables].reshape(shape.num_seqs, -1, shape.num_kv_heads, shape.head_dim)
    dense_k = dense_k[:, :seq_len].transpose(1, 2).contiguous()
    dense_v = dense_v[:, :seq_len].transpose(1, 2).contiguous()
    return query, k_cache, v_cache, meta, dense_k, dense_v


def _sdpa_candidates(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: Shape, scale: float
) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    """SDPA calls to try in order; the first that runs is timed. q: [B, H, Lq, D]."""
    group = shape.num_heads // shape.num_kv_heads
    k_rep = k.repeat_interleave(group, dim=1) if group > 1 else k
    v_rep = v.repeat_interleave(group, dim=1) if group > 1 else v
    if shape.kind == "decode":
        return [
            ("gqa", lambda: F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)),
            ("expanded", lambda: F.scaled_dot_product_attention(q, k_rep, v_rep, scale=scale)),
        ]
    if shape.context_len == 0:
        return [
            (
                "gqa causal",
                lambda: F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, scale=scale, enable_gqa=True
                ),
            ),
            (
                "expanded causal",
                lambda: F.scaled_dot_product_attention(
                    q, k_rep, v_rep, is_causal=True, scale=scale
                ),
            ),
        ]
    q_len, kv_len = q.shape[2], k.shape[2]
    q_pos = torch.arange(kv_len - q_len, kv_len, device=q.device)
    mask = torch.arange(kv_len, device=q.device)[None, :] <= q_pos[:, None]
    candidates: list[tuple[str, Callable[[], torch.Tensor]]] = []
    try:
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(q_len, kv_len)
        candidates.append(
            (
                "expanded causal_lower_right",
                lambda: F.scaled_dot_product_attention(
                    q, k_rep, v_rep, attn_mask=bias, scale=scale
                ),
            )
        )
    except ImportError:
        pass
    candidates.append(
        (
            "expanded bool mask",
            lambda: F.scaled_dot_product_attention(q, k_rep, v_rep, attn_mask=mask, scale=scale),
        )
    )
    return candidates


def time_ms(fn: Callable[[], object], flush: torch.Tensor, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = []
    for _ in range(iters):
        flush.zero_()  # evict the previous call's K/V from L2
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return float(statistics.median(s.elapsed_time(e) for s, e in events))


def bench_shape(shape: Shape, dtype: torch.dtype, warmup: int, iters: int) -> Timing:
    from batchgen.kernels import paged_attention

    timing = Timing(shape)
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    query, k_cache, v_cache, meta, dense_k, dense_v = build_paged_batch(shape, dtype, torch.device("cuda"))
    scale = 1.0 / math.sqrt(shape.head_dim)
    out_triton: torch.Tensor | None = None
    try:
        out_triton = paged_attention(query, k_cache, v_cache, meta, scale, backend="triton")
        timing.triton_ms = time_ms(
            lambda: paged_attention(query, k_cache, v_cache, meta, scale, backend="triton"),
            flush,
            warmup,
            iters,
        )
    except Exception as exc:  # a failed shape is recorded, the rest still run
        timing.errors.append(f"triton: {exc!r}")

    q = query.view(shape.num_seqs, shape.query_len, shape.num_heads, shape.head_dim)
    q = q.transpose(1, 2)
    for name, fn in _sdpa_candidates(q, dense_k, dense_v, shape, scale):
        try:
            out_sdpa = fn()
            timing.sdpa_ms = time_ms(fn, flush, warmup, iters)
        except Exception as exc:  # try the next SDPA form
            timing.errors.append(f"sdpa {name}: {exc!r}")
            continue
        timing.sdpa_variant = name
        if out_triton is not None:
            flat = out_sdpa.transpose(1, 2).reshape_as(out_triton)
            timing.max_abs_err_vs_sdpa = float((flat.float() - out_triton.float()).abs().max())
        break

    try:
        timing.torch_path_ms = time_ms(
            lambda: paged_attention(query, k_cache, v_cache, meta, scale, backend="torch"),
            flush,
            max(1, warmup // 2),
            max(3, iters // 4),
        )
    except Exception as exc:  # recorded; the PyTorch path is only a reference here
        timing.errors.append(f"torch path: {exc!r}")

    if timing.triton_ms:
        seq_len = shape.context_len + shape.query_len
        if shape.kind == "decode":
            kv_bytes = 2 * shape.num_seqs * seq_len * shape.num_kv_heads * shape.head_dim
            timing.kv_gb_per_s = kv_bytes * dtype.itemsize / timing.triton_ms / 1e6
        else:
            visible = sum(shape.context_len + i + 1 for i in range(shape.query_len))
            flops = 4 * shape.num_seqs * visible * shape.num_heads * shape.head_dim
            timing.tflops = flops / timing.triton_ms / 1e9
    return timing


def kernel_test_command(
    test_files: Sequence[str], *, timeout_per_test_s: int = 300, collect_only: bool = False
) -> list[str]:
    """The pytest command of the compiled kernel tests `test_files` (names in tests/kernels: the
    Triton ones; the CPU C++ kernel's tests would spend a minute of device time building it),
    `gpu`-marked tests included, no cache folder written into the checkout."""
    files = [str(Path("tests") / "kernels" / name) for name in test_files]
    cmd = [sys.executable, "-m", "pytest", *files, "-m", "gpu or not gpu", "-q", "-rs", "--tb=short"]
    cmd += ["-p", "no:cacheprovider"]
    if collect_only:
        return [*cmd, "--collect-only"]
    return [*cmd, f"--timeout={timeout_per_test_s}"]


def kernel_test_env() -> dict[str, str]:
    """The environment of the kernel tests: BATCHGEN_REAL_GPU=1 (tests/conftest.py then leaves
    TRITON_INTERPRET unset, so the kernels compile), TRITON_INTERPRET removed."""
    env = dict(os.environ, BATCHGEN_REAL_GPU="1")
    env.pop("TRITON_INTERPRET", None)
    return env


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def run_kernel_tests(out_dir: Path, test_files: Sequence[str], *, timeout_s: float | None = None) -> dict[str, Any]:
    """Run `kernel_test_command` from the checkout's root, its log in DIR/pytest_kernels.log.

    Returns the return code (None when `timeout_s` ran out and the run was killed), the counts
    of pytest's summary line and the line itself. FileNotFoundError without a source checkout."""
    missing = [name for name in test_files if not (_REPO_ROOT / "tests" / "kernels" / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{_REPO_ROOT / 'tests' / 'kernels'}: {', '.join(missing)} not found (run from a source checkout)")
    log = out_dir / "pytest_kernels.log"
    returncode: int | None
    with log.open("w") as fh:
        try:
            proc = subprocess.run(
                kernel_test_command(test_files), cwd=_REPO_ROOT, env=kernel_test_env(), stdout=fh, stderr=subprocess.STDOUT,
                timeout=timeout_s,
            )
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            returncode = None
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    summary = lines[-1] if lines else ""
    counts = {("errors" if kind.startswith("error") else kind): int(n) for n, kind in _COUNT.findall(summary)}
    return {
        "returncode": returncode,
        "timed_out": returncode is None,
        "timeout_s": timeout_s,
        "log": log.name,
        "summary": summary,
        "counts": counts,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_timings(timings: list[Timing]) -> None:
    header = (
        f"{'kind':8}{'seqs':>5}{'q':>5}{'ctx':>6}{'heads':>7}{'D':>5}"
        f"{'triton ms':>11}{'sdpa ms':>9}{'torch ms':>10}{'speedup':>9}{'GB/s':>7}{'TF/s':>7}"
        f"{'max err':>9}  sdpa form"
    )
    print(header)
    print("-" * len(header))
    for t in timings:
        s = t.shape
        speedup = t.sdpa_ms / t.triton_ms if t.sdpa_ms and t.triton_ms else None
        print(
            f"{s.kind:8}{s.num_seqs:>5}{s.query_len:>5}{s.context_len:>6}"
            f"{f'{s.num_heads}/{s.num_kv_heads}':>7}{s.head_dim:>5}"
            f"{_fmt(t.triton_ms, '.3f'):>11}{_fmt(t.sdpa_ms, '.3f'):>9}"
            f"{_fmt(t.torch_path_ms, '.2f'):>10}{_fmt(speedup, '.2f'):>9}"
            f"{_fmt(t.kv_gb_per_s, '.0f'):>7}{_fmt(t.tflops, '.1f'):>7}"
            f"{_fmt(t.max_abs_err_vs_sdpa, '.1e'):>9}  {t.sdpa_variant or '-'}"
        )
        for err in t.errors:
            print(f"    ! {err[:200]}")
