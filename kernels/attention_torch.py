"""PyTorch reference path for paged attention and KV writes (CPU, and any device without Triton).

Shape of the KV pool, per layer: `[num_blocks, block_size, num_kv_heads, head_dim]`, any strides
(the compiled CPU kernel reads strided views: `attention_cpu.cpu_kv_cache`).
Prefill chunks run one SDPA call per sequence (fastest on CPU: see the toolchain notes); decode
tokens of all sequences run as one padded SDPA call with a mask, since launch overhead dominates
there. Imports torch only.

The two options every backend implements (`dispatch.paged_attention`):

    sliding_window w: query at position p sees keys p - w + 1 .. p (its own included; HF/vLLM)
    logits_soft_cap c: score = c * tanh(scale * q.k / c), before the mask and the softmax

    keys of sequence s:  | 0 ........ p - w | p - w + 1 ... p |  (p: the query's position)
                           outside the window   visible

With a window only the keys some query of the call can see are gathered; with a soft cap the
scores are computed explicitly (SDPA has no cap), in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .metadata import AttentionMetadata

__all__ = ["paged_attention_torch", "write_kv_torch"]


def write_kv_torch(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each token's K/V ([num_tokens, num_kv_heads, head_dim]) at its pool slot (mutates the
    caches; they may be strided views, as the compiled CPU kernel's layout is)."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if k_cache.is_contiguous() and v_cache.is_contiguous():
        k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value.to(v_cache.dtype))
        return
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:
        raise IndexError("write_kv: slot -1 (padding) needs the Triton or compiled CPU path")
    block_size = k_cache.shape[1]
    blocks, offsets = slot_mapping // block_size, slot_mapping % block_size
    k_cache[blocks, offsets] = key.to(k_cache.dtype)
    v_cache[blocks, offsets] = value.to(v_cache.dtype)


def _gather(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """K or V of one sequence as [seq_len, num_kv_heads, head_dim]."""
    block_size = cache.shape[1]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = cache.index_select(0, block_table[:num_blocks])
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:seq_len]


def _expand_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """[..., num_kv_heads, L, D] -> [..., num_kv_heads * group, L, D] for grouped-query attention."""
    return x if group == 1 else x.repeat_interleave(group, dim=-3)


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    logits_soft_cap: float | None,
) -> torch.Tensor:
    """softmax(scores) @ v over [..., Lq, D] x [..., Lk, D]; mask True = visible, None = causal
    with Lq == Lk. SDPA without a cap; explicit float32 scores with one."""
    if logits_soft_cap is None:
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    if mask is None:
        n = q.shape[-2]
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
    probs = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
    return (probs @ v.float()).to(q.dtype)


def paged_attention_torch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    *,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
) -> torch.Tensor:
    """Attention of every query token over its sequence's cached K/V, with an optional sliding
    window and logit soft cap (module docstring).

    query: [num_tokens, num_heads, head_dim]; returns the same shape. Reads the caches only.
    """
    group = query.shape[1] // k_cache.shape[2]
    out = torch.empty_like(query)
    decode_rows: list[int] = []
    start = 0
    for s, (q_len, seq_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host, strict=True)):
        if q_len == 1:
            decode_rows.append(s)
            start += 1
            continue
        context_len = seq_len - q_len
        # Keys before `first` are outside every query's window: not gathered.
        first = 0 if sliding_window is None else max(0, context_len - sliding_window + 1)
        q = query[start : start + q_len].transpose(0, 1)  # [H, q_len, D]
        k = _expand_kv(_gather(k_cache, meta.block_tables[s], seq_len)[first:].transpose(0, 1), group)
        v = _expand_kv(_gather(v_cache, meta.block_tables[s], seq_len)[first:].transpose(0, 1), group)
        mask: torch.Tensor | None = None
        if context_len > 0 or sliding_window is not None:
            # Query i sits at position context_len + i and sees keys (context_len + i - window,
            # context_len + i].
            q_pos = torch.arange(context_len, seq_len, device=q.device)
            k_pos = torch.arange(first, seq_len, device=q.device)
            mask = k_pos[None, :] <= q_pos[:, None]
            if sliding_window is not None:
                mask &= k_pos[None, :] > q_pos[:, None] - sliding_window
        o = _attend(q, k.to(q.dtype), v.to(q.dtype), mask, scale, logits_soft_cap)
        out[start : start + q_len] = o.transpose(0, 1)
        start += q_len
    if decode_rows:
        _decode_batch(query, k_cache, v_cache, meta, scale, decode_rows, group, out, sliding_window, logits_soft_cap)
    return out


def _decode_batch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    rows: list[int],
    group: int,
    out: torch.Tensor,
    sliding_window: int | None,
    logits_soft_cap: float | None,
) -> None:
    """All single-token queries in one padded call: [B, H, 1, D] over [B, H, Lmax, D]."""
    block_size = k_cache.shape[1]
    seq_lens = [meta.seq_lens_host[s] for s in rows]
    max_len = max(seq_lens)
    max_blocks = (max_len + block_size - 1) // block_size
    row_idx = torch.tensor(rows, device=query.device)
    tables = meta.block_tables.index_select(0, row_idx)[:, :max_blocks].long()
    token_idx = meta.query_start_loc.index_select(0, row_idx).long()
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    b = len(rows)
    num_heads = query.shape[1]
    k = k_cache[tables].reshape(b, max_blocks * block_size, num_kv_heads, head_dim)[:, :max_len]
    v = v_cache[tables].reshape(b, max_blocks * block_size, num_kv_heads, head_dim)[:, :max_len]
    k = k.transpose(1, 2).to(query.dtype)  # [B, Hkv, L, D]
    v = v.transpose(1, 2).to(query.dtype)
    # Grouped-query attention without copying K/V: the q heads of a group become the query
    # rows of their kv head, [B, Hkv, group, D].
    q = query.index_select(0, token_idx).view(b, num_kv_heads, group, head_dim)
    lens = torch.tensor(seq_lens, device=query.device)
    k_pos = torch.arange(max_len, device=query.device)[None, :]
    visible = k_pos < lens[:, None]
    if sliding_window is not None:
        visible &= k_pos >= lens[:, None] - sliding_window  # the query sits at position len - 1
    o = _attend(q, k, v, visible[:, None, None, :], scale, logits_soft_cap)
    out.index_copy_(0, token_idx, o.reshape(b, num_heads, head_dim))
