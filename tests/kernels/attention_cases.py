"""Shared builders for the kernel tests: random paged batches and a naive per-token reference.

Not a test module (no `test_` prefix); the kernel test modules import it relatively.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from batchgen.kernels import AttentionMetadata

# Triton runs interpreted on CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1), or natively
# on CUDA tensors when BATCHGEN_REAL_GPU=1 keeps the interpreter off.
IS_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available()
CAN_RUN_TRITON = IS_INTERPRETED or HAS_CUDA
ON_GPU = HAS_CUDA and not IS_INTERPRETED  # compiled kernels on a real GPU
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

# The triton 3.6 interpreter returns program ids as 1-element arrays and turns a loop bound derived
# from one into a Python int with int(array), which numpy >= 1.25 deprecates. Harmless here (numpy
# < 2.4 is pinned for the interpreter), but pytest turns warnings into errors.
INTERPRETER_WARNING = "ignore:Conversion of an array with ndim > 0:DeprecationWarning"

# Max abs error allowed against the fp64 reference, per dtype (the output is rounded to dtype
# and, for 16-bit inputs, the probabilities are rounded to dtype before P @ V).
ATOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
RTOL = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 2e-2}


@dataclass(frozen=True)
class Batch:
    query: torch.Tensor  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor  # [num_tokens, num_kv_heads, head_dim], this step's new K
    value: torch.Tensor
    k_cache: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor
    meta: AttentionMetadata
    scale: float


def make_batch(
    query_lens: Sequence[int],
    context_lens: Sequence[int],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    spare_blocks: int = 7,
    device: torch.device = DEVICE,
) -> Batch:
    """A flat batch whose sequences own randomly scattered pool blocks, all filled with random K/V.

    The chunk's own K/V (`key`, `value`) are already stored at `meta.slot_mapping`, as the engine
    does before attention. Block tables are padded with a block id that belongs to no sequence.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in zip(query_lens, context_lens, strict=True)]
    blocks_per_seq = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    max_blocks = max(blocks_per_seq)
    block_tables = torch.full((len(seq_lens), max_blocks), int(perm[-1]), dtype=torch.int32)
    slots: list[int] = []
    used = 0
    for s, (n, q_len, seq_len) in enumerate(zip(blocks_per_seq, query_lens, seq_lens, strict=True)):
        block_tables[s, :n] = perm[used : used + n]
        used += n
        for pos in range(seq_len - q_len, seq_len):
            slots.append(int(block_tables[s, pos // block_size]) * block_size + pos % block_size)

    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    num_tokens = sum(query_lens)
    query = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    key = flat_k[slot_mapping].clone()
    value = flat_v[slot_mapping].clone()

    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        slot_mapping=slot_mapping.to(device),
        query_lens_host=tuple(query_lens),
        seq_lens_host=tuple(seq_lens),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return Batch(
        query=query.to(device),
        key=key.to(device),
        value=value.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        meta=meta,
        scale=1.0 / math.sqrt(head_dim),
    )


def in_cpu_layout(batch: Batch) -> Batch:
    """The batch with its pools copied into the compiled CPU kernel's layout (same values)."""
    from batchgen.kernels.attention_cpu import cpu_kv_cache

    k_cache, v_cache = cpu_kv_cache(*batch.k_cache.shape, dtype=batch.k_cache.dtype)
    k_cache.copy_(batch.k_cache)
    v_cache.copy_(batch.v_cache)
    return replace(batch, k_cache=k_cache, v_cache=v_cache)


def naive_attention(
    batch: Batch, *, sliding_window: int | None = None, logits_soft_cap: float | None = None
) -> torch.Tensor:
    """fp64 reference, one token at a time: gather the sequence's K/V up to the token's position
    (from position - sliding_window + 1 with a window); scores capped as c * tanh(s / c)."""
    meta = batch.meta
    query = batch.query.double().cpu()
    k_cache = batch.k_cache.double().cpu()
    v_cache = batch.v_cache.double().cpu()
    block_tables = meta.block_tables.cpu().long()
    block_size = k_cache.shape[1]
    group = query.shape[1] // k_cache.shape[2]
    out = torch.empty_like(query)
    token = 0
    for s, (q_len, seq_len) in enumerate(
        zip(meta.query_lens_host, meta.seq_lens_host, strict=True)
    ):
        for i in range(q_len):
            pos = seq_len - q_len + i
            first = 0 if sliding_window is None else max(0, pos - sliding_window + 1)
            key_pos = torch.arange(first, pos + 1)
            blocks = block_tables[s, key_pos // block_size]
            k = k_cache[blocks, key_pos % block_size].repeat_interleave(group, dim=1)  # [L, H, D]
            v = v_cache[blocks, key_pos % block_size].repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,lhd->hl", query[token], k) * batch.scale
            if logits_soft_cap is not None:
                scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
            out[token] = torch.einsum("hl,lhd->hd", scores.softmax(dim=-1), v)
            token += 1
    return out


def max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual.double().cpu() - expected.double().cpu()).abs().max())


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), atol=ATOL[dtype], rtol=RTOL[dtype]
    )


# The window and soft-cap cases every backend runs, (query_lens, context_lens): decode at len 1,
# at a block multiple (48) and far past the window (101); a chunk over a prefix that ends
# mid-block (37); a chunk longer than most windows over a prefix (30 + 40); a plain prefill.
OPTION_CASE = ((1, 1, 1, 7, 40, 20), (0, 47, 100, 37, 30, 0))
# 1: the query's own key only; 5: inside one block of 16; 16: one block's width; 21: crosses a
# block boundary everywhere; 300: longer than every context (the same as no window).
WINDOWS = (1, 5, 16, 21, 300)
# The query is scaled by QUERY_GAIN in the soft-cap cases, so that scores (about N(0, 64)) reach
# the cap's bend: with plain N(0, 1) scores a cap of 30-50 changes almost nothing.
SOFT_CAPS = (2.0, 30.0)
QUERY_GAIN = 8.0


def with_query_gain(batch: Batch, gain: float = QUERY_GAIN) -> Batch:
    """The batch with its query multiplied by `gain` (larger scores)."""
    return replace(batch, query=batch.query * gain)


def poison_unseen_blocks(batch: Batch, sliding_window: int | None, key_tile: int | None = None) -> Batch:
    """The batch with NaN in every pool block that no query can see: the spare blocks, and each
    sequence's blocks that lie wholly before its first query's window. A kernel that reads such
    a block, even to mask it, returns NaN (a masked NaN score or a 0 * NaN value).

    key_tile: a kernel that visits keys in aligned tiles of this many (Triton's TILE_N) may read
    the blocks of the tile the window starts in; those stay clean (default: the block size)."""
    meta = batch.meta
    block_size = batch.k_cache.shape[1]
    tile = key_tile or block_size
    seen: set[int] = set()
    tables = meta.block_tables.cpu()
    for s, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host, strict=True)):
        first_pos = seq_len - q_len
        lo = 0 if sliding_window is None else max(0, first_pos - sliding_window + 1)
        lo = lo // tile * tile
        seen.update(int(b) for b in tables[s, lo // block_size : -(-seq_len // block_size)])
    unseen = torch.tensor(sorted(set(range(batch.k_cache.shape[0])) - seen), dtype=torch.long)
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    k_cache[unseen.to(k_cache.device)] = float("nan")
    v_cache[unseen.to(v_cache.device)] = float("nan")
    return replace(batch, k_cache=k_cache, v_cache=v_cache)


def run_cpu_module(
    module: object, batch: Batch, *, sliding_window: int | None = None, logits_soft_cap: float | None = None
) -> torch.Tensor:
    """`paged_attention` of a compiled CPU kernel module (the production build or a test variant)."""
    meta = batch.meta
    out: torch.Tensor = module.paged_attention(  # type: ignore[attr-defined]
        batch.query.contiguous(), batch.k_cache, batch.v_cache, meta.block_tables, meta.seq_lens,
        meta.query_start_loc, batch.scale, sliding_window, logits_soft_cap,
    )  # fmt: skip
    return out
