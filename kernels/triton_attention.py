# mypy: ignore-errors
"""Triton paged attention over the flat batch: decode tokens and prefill chunks in one launch.

One program handles one query tile of one sequence for one KV head. The tile's rows are
(query token, q head of the KV head's group) pairs, so all q heads that share a KV head read each
K/V tile once (grouped-query attention), and the row count is padded to a `tl.dot`-legal size
(at least 16), as in vLLM's unified Triton attention:

    row m of the tile:  token  q_block * BLOCK_Q + m // GROUP,   q head  kv_head * GROUP + m % GROUP
    rows >= BLOCK_Q * GROUP are padding (GROUP need not be a power of two)

Grid axis 0 enumerates query tiles of all sequences without a host sync: sequence s owns the
tile ids query_start_loc[s] // BLOCK_Q + s ..., found by binary search; ids past a sequence's
last tile return at once. The launch is sized by an upper bound, num_tokens // BLOCK_Q + num_seqs.

Each query token at absolute position p = seq_len - q_len + i reads keys 0 .. p through the block
table (the chunk's own K/V are already in the pool), one TILE_N-key tile at a time, with the
softmax computed online in fp32 (base-2 exponentials, scale folded into the logits):

    keys:   | cached prefix (context_len) | this chunk (q_len) |
    tile t: [t * TILE_N, (t + 1) * TILE_N) masked by key_pos <= p

Key positions map to pool slots element-wise (block_tables[s, pos // BLOCK_SIZE], pos % BLOCK_SIZE),
so TILE_N is independent of the block size. Reads the caches only; writes a new output tensor.
Imports torch and triton only.

Options (`dispatch.paged_attention`), each a compile-time switch so that a model without them
runs the same code as before:
- SLIDING_WINDOW: row p sees keys p - window + 1 .. p; tiles wholly below the window of the
  program's first token are not visited at all (`first_tile`), the rest are masked per row.
- SOFT_CAP: logits cap * tanh(scale * q.k / cap) (Gemma 2), then to base 2.
- head_dim need not be a power of two (Phi-3's 96): the head is padded to HEAD_DIM_PADDED lanes,
  masked on load and store. Heads above 128 lanes (Gemma's 256) take smaller tiles (32-row
  prefill tiles, 16-key tiles, one stage) so that q, K, V and the accumulator fit.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .metadata import AttentionMetadata

__all__ = ["paged_attention_triton"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TILE_N = 32
_LOG2E = 1.4426950408889634
LOG2E = tl.constexpr(_LOG2E)


@triton.jit
def _soft_cap(s, cap):
    """cap * tanh(s / cap), fp32. tanh|u| from exp2 where |u| >= 1/4, from its Taylor series to
    u^9 below (relative error under 1e-8 there), where (1 - e) / (1 + e) would lose the low bits
    of a small u to cancellation."""
    u = s / cap
    a = tl.abs(u)
    a2 = a * a
    small = a * (1.0 + a2 * (-0.3333333333333333 + a2 * (0.13333333333333333 + a2 * (-0.05396825396825397 + a2 * 0.021869488536155203))))
    e = tl.math.exp2(a * (-2.0 * LOG2E))
    t = tl.where(a < 0.25, small, (1.0 - e) / (1.0 + e))
    return tl.where(u < 0.0, -t, t) * cap


@triton.jit
def _find_seq_idx(query_start_loc_ptr, q_block_id, num_seqs, BLOCK_Q: tl.constexpr):
    """Largest s with query_start_loc[s] // BLOCK_Q + s <= q_block_id (binary search)."""
    lo: tl.int32 = 0  # annotated: a loop-carried int32 tensor, not a constexpr
    hi: tl.int32 = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_block = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_block <= q_block_id:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# num_seqs and stride_bt (the block-table width, the longest sequence's block count) change from
# step to step: no value specialisation (== 1, multiple of 16) of either, so no recompiles as
# they pass those values.
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
def _paged_attention_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    query_start_loc_ptr,
    qk_scale,
    sm_scale,
    soft_cap,
    window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PADDED: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    TILE_N: tl.constexpr,
    DOT_F32: tl.constexpr,
    DOT_IEEE: tl.constexpr,
    SLIDING_WINDOW: tl.constexpr,
    SOFT_CAP: tl.constexpr,
):
    q_block_id = tl.program_id(0)
    kv_head = tl.program_id(1)

    seq_idx = _find_seq_idx(query_start_loc_ptr, q_block_id, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + seq_idx)
    q_len = tl.load(query_start_loc_ptr + seq_idx + 1) - q_start
    q_block = q_block_id - (q_start // BLOCK_Q + seq_idx)
    if q_block * BLOCK_Q >= q_len:
        return

    seq_len = tl.load(seq_lens_ptr + seq_idx)
    context_len = seq_len - q_len

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM_PADDED)
    tok = q_block * BLOCK_Q + offs_m // GROUP  # token index inside this sequence's chunk
    head = kv_head * GROUP + offs_m % GROUP
    row_valid = (offs_m < BLOCK_Q * GROUP) & (tok < q_len)
    q_pos = context_len + tok  # absolute position of each row's token
    # The mask of q and out: real rows, and the head's lanes where it is padded.
    q_mask = row_valid[:, None]
    if HEAD_DIM_PADDED != HEAD_DIM:
        q_mask = q_mask & (offs_d < HEAD_DIM)[None, :]

    q_offs = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    q = tl.load(q_ptr + q_offs + offs_d[None, :] * stride_qd, mask=q_mask, other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)

    # Keys this tile needs: up to the position of its last real token.
    last_tok = tl.minimum(q_block * BLOCK_Q + BLOCK_Q - 1, q_len - 1)
    kv_end = context_len + last_tok + 1
    num_tiles = tl.cdiv(kv_end, TILE_N)
    first_tile = 0
    if SLIDING_WINDOW:
        # The program's first token sees the lowest keys: tiles below its window are skipped.
        first_tile = tl.maximum(context_len + q_block * BLOCK_Q - window + 1, 0) // TILE_N

    # A finite floor instead of -inf keeps padding rows free of inf - inf (NaN).
    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_PADDED], dtype=tl.float32)

    bt_row = block_tables_ptr + seq_idx.to(tl.int64) * stride_bt
    k_head = kv_head.to(tl.int64) * stride_kh
    v_head = kv_head.to(tl.int64) * stride_vh
    for t in range(first_tile, num_tiles):
        offs_n = t * TILE_N + tl.arange(0, TILE_N)
        n_valid = offs_n < kv_end
        block_id = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_valid, other=0).to(tl.int64)
        in_block = (offs_n % BLOCK_SIZE).to(tl.int64)
        k_offs = block_id * stride_kb + in_block * stride_ks + k_head
        v_offs = block_id * stride_vb + in_block * stride_vs + v_head
        k_mask = n_valid[None, :]
        v_mask = n_valid[:, None]
        if HEAD_DIM_PADDED != HEAD_DIM:
            k_mask = k_mask & (offs_d < HEAD_DIM)[:, None]
            v_mask = v_mask & (offs_d < HEAD_DIM)[None, :]
        k = tl.load(
            k_cache_ptr + k_offs[None, :] + offs_d[:, None] * stride_kd, mask=k_mask, other=0.0
        )  # [HEAD_DIM_PADDED, TILE_N]
        v = tl.load(
            v_cache_ptr + v_offs[:, None] + offs_d[None, :] * stride_vd, mask=v_mask, other=0.0
        )  # [TILE_N, HEAD_DIM_PADDED]
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)

        s = tl.dot(q, k, input_precision="ieee") if DOT_IEEE else tl.dot(q, k)
        s = _soft_cap(s * sm_scale, soft_cap) * LOG2E if SOFT_CAP else s * qk_scale
        # Causal mask; it also hides keys past kv_end for every real row. Padding rows are
        # never stored, so what they see does not matter.
        visible = offs_n[None, :] <= q_pos[:, None]
        if SLIDING_WINDOW:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        p = p.to(v.dtype)  # fp32 stays fp32; fp16/bf16 feed the tensor cores
        acc += tl.dot(p, v, input_precision="ieee") if DOT_IEEE else tl.dot(p, v)
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    o_offs = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(
        out_ptr + o_offs + offs_d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=q_mask,
    )


def _is_interpreted(kernel: object) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_launch_mode(kernel: object, device: torch.device) -> bool:
    """Whether to run interpreted; raises if the environment and the kernel disagree.

    TRITON_INTERPRET is read now (at call time); the kernel was decorated with whatever value it
    had when its module was imported, so both must say the same.
    """
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if interpret != _is_interpreted(kernel):
        raise RuntimeError(
            "TRITON_INTERPRET changed after batchgen's Triton kernels were imported; "
            "set it before the first Triton call (tests: tests/conftest.py)"
        )
    if not interpret and device.type != "cuda":
        raise ValueError(
            f"the Triton backend needs CUDA tensors (got {device.type}); "
            "use backend='torch' or set TRITON_INTERPRET=1 before importing batchgen"
        )
    return interpret


def _check_inputs(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if query.dim() != 3 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise ValueError(
            "expected query [num_tokens, num_heads, head_dim] and k/v caches "
            f"[num_blocks, block_size, num_kv_heads, head_dim] of equal shape; got {tuple(query.shape)}, "
            f"{tuple(k_cache.shape)}, {tuple(v_cache.shape)}"
        )
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"head_dim differs: query {head_dim}, cache {k_cache.shape[3]}")
    if head_dim < 1 or head_dim > 256:
        raise ValueError(f"Triton attention needs a head_dim in [1, 256], got {head_dim}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if query.dtype not in _DTYPES or k_cache.dtype != query.dtype or v_cache.dtype != query.dtype:
        raise ValueError(
            f"Triton attention needs query and caches of one dtype in {_DTYPES}; got "
            f"{query.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )


def paged_attention_triton(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Attention of every query token over its sequence's paged K/V; one kernel launch.

    query: [num_tokens, num_heads, head_dim] (fp16, bf16 or fp32; head_dim 1-256); caches
    [num_blocks, block_size, num_kv_heads, head_dim] of the same dtype. sliding_window and
    logits_soft_cap as in `dispatch.paged_attention` (checked there). Returns a new tensor shaped
    and typed like query. Reads the caches only. Raises ValueError on unsupported shapes/dtypes.
    """
    _check_inputs(query, k_cache, v_cache)
    interpret = check_launch_mode(_paged_attention_kernel, query.device)
    out = torch.empty_like(query)
    num_tokens, num_heads, head_dim = query.shape
    if num_tokens == 0 or meta.num_seqs == 0:
        return out
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads

    # 16 lanes minimum for tl.dot's K dimension.
    head_dim_padded = max(16, triton.next_power_of_2(head_dim))
    # Heads above 128 lanes: q, K, V and the fp32 accumulator of 64-row, 32-key tiles would not
    # fit beside each other (registers, shared memory on smaller GPUs): halve both.
    is_wide = head_dim_padded > 128
    # 16 rows minimum for tl.dot; bigger tiles for prefill so K/V tiles are reused across tokens.
    prefill_rows = 32 if is_wide else 64
    min_rows = prefill_rows if meta.max_query_len * group >= prefill_rows else 16
    block_m = max(min_rows, triton.next_power_of_2(group))
    block_q = block_m // group
    num_q_blocks = num_tokens // block_q + meta.num_seqs
    is_fp32 = query.dtype == torch.float32
    dot_f32 = interpret and query.dtype == torch.bfloat16  # bf16 tl.dot is wrong when interpreted
    dot_ieee = is_fp32 and not interpret

    grid = (num_q_blocks, num_kv_heads)
    _paged_attention_kernel[grid](
        out,
        query,
        k_cache,
        v_cache,
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        scale * _LOG2E,
        scale,
        1.0 if logits_soft_cap is None else float(logits_soft_cap),
        0 if sliding_window is None else sliding_window,
        meta.num_seqs,
        *query.stride(),
        *out.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        meta.block_tables.stride(0),
        GROUP=group,
        HEAD_DIM=head_dim,
        HEAD_DIM_PADDED=head_dim_padded,
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        TILE_N=16 if is_wide else _TILE_N,
        DOT_F32=dot_f32,
        DOT_IEEE=dot_ieee,
        SLIDING_WINDOW=sliding_window is not None,
        SOFT_CAP=logits_soft_cap is not None,
        num_warps=4,
        num_stages=1 if is_wide else 2,
    )
    return out
