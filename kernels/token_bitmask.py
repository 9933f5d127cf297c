"""Grammar token bitmasks (llguidance's and xgrammar's layout) in PyTorch: the reference for
the compiled CPU op and the path for CUDA tensors.

A bitmask row is int32 words: bit j of word w allows token 32 w + j. Read as little-endian
bytes, bit k of byte b allows token 8 b + k, so one lookup of a [256, 8] table per byte unpacks
a row (a shift per bit over [rows, words, 32] costs several times more on a CPU). Tokens past the
mask's width are never allowed.

    unpack_bitmask(bitmask, vocab)              bool [rows, vocab]
    apply_token_bitmask_torch(x, rows, bitmask) x[rows[i], t] = -inf where bitmask[i] bans t

Imports torch only.
"""

from __future__ import annotations

import torch

__all__ = ["apply_token_bitmask_torch", "check_token_bitmask_args", "unpack_bitmask"]

_BITS = torch.arange(8, dtype=torch.int64)


def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: entry (b, k) is bit k of byte b."""
    return ((torch.arange(256, dtype=torch.int64)[:, None] >> _BITS) & 1).bool().to(device)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int, device: torch.device | None = None) -> torch.Tensor:
    """The allowed tokens of each row, bool [rows, vocab_size] on `device` (default: the
    bitmask's): bitmask is int32 [rows, words]; tokens at or past 32 * words are not allowed."""
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
        raise ValueError(f"bitmask must be int32 [rows, words], got {bitmask.dtype} {tuple(bitmask.shape)}")
    target = bitmask.device if device is None else device
    words = bitmask.to(target).contiguous()
    num_rows, width = words.shape[0], 32 * words.shape[1]
    table = _byte_table(target)
    allowed = table.index_select(0, words.view(torch.uint8).reshape(-1).long()).reshape(num_rows, width)
    if vocab_size <= width:
        return allowed[:, :vocab_size]
    pad = torch.zeros(num_rows, vocab_size - width, dtype=torch.bool, device=target)
    return torch.cat([allowed, pad], dim=1)


def check_token_bitmask_args(x: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """ValueError unless x is [T, V], rows int64 [k] of distinct rows of x, bitmask int32 [k, words]."""
    if x.dim() != 2:
        raise ValueError(f"x must be [rows, vocab], got {tuple(x.shape)}")
    if rows.dtype != torch.int64 or rows.dim() != 1:
        raise ValueError(f"rows must be int64 [k], got {rows.dtype} {tuple(rows.shape)}")
    if bitmask.dtype != torch.int32 or bitmask.dim() != 2 or bitmask.shape[0] != rows.shape[0]:
        raise ValueError(
            f"bitmask must be int32 [{rows.shape[0]}, words], got {bitmask.dtype} {tuple(bitmask.shape)}"
        )
    listed = rows.tolist()
    if any(not 0 <= r < x.shape[0] for r in listed) or len(set(listed)) != len(listed):
        raise ValueError(f"rows must be distinct rows of x's {x.shape[0]}, got {listed}")


def apply_token_bitmask_torch(x: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """In place: every token of row rows[i] of `x` that bitmask[i] bans becomes -inf. Returns
    bool [k]: True where the row has no logit above -inf left (NaN counts as one left)."""
    check_token_bitmask_args(x, rows, bitmask)
    allowed = unpack_bitmask(bitmask, x.shape[1], x.device)
    rows = rows.to(x.device)
    sub = x.index_select(0, rows)
    sub.masked_fill_(~allowed, float("-inf"))
    x.index_copy_(0, rows, sub)
    return torch.isneginf(sub.amax(dim=1)) if sub.shape[1] > 0 else torch.ones(sub.shape[0], dtype=torch.bool)
