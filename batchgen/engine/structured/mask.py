"""The grammar mask as a logits processor: token bitmasks unpacked and applied to logits rows.

A bitmask row is int32 words, llguidance's (and xgrammar's) layout: bit j of word w allows
token 32 w + j. Read as little-endian bytes, bit k of byte b allows token 8 b + k, so one
lookup of a [256, 8] table per byte unpacks a row (a shift per bit over [rows, words, 32] costs
several times more on a CPU). Tokens past the mask's width are never allowed.

    apply_grammar_mask(x, rows, allowed)      x[rows[i], t] = -inf where allowed[i, t] is False

The sampler runs it at the pipeline's grammar slot (after the penalties, before temperature);
the engine unpacks the masks while the forward pass runs. May import: torch.
"""

from __future__ import annotations

import torch

__all__ = ["apply_grammar_mask", "unpack_bitmask"]

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


def apply_grammar_mask(x: torch.Tensor, rows: torch.Tensor, allowed: torch.Tensor) -> list[int]:
    """In place: every token of row rows[i] of `x` [num_rows, vocab] that allowed[i] (bool
    [len(rows), vocab]) does not allow becomes -inf. Returns the positions i whose row has no
    finite logit left (another processor banned every token the grammar allows)."""
    if allowed.shape != (rows.shape[0], x.shape[1]):
        raise ValueError(f"allowed must be [{rows.shape[0]}, {x.shape[1]}], got {tuple(allowed.shape)}")
    sub = x.index_select(0, rows)
    sub.masked_fill_(~allowed.to(x.device), float("-inf"))
    x.index_copy_(0, rows, sub)
    empty = torch.isneginf(sub.amax(dim=1))
    return [int(i) for i in torch.nonzero(empty).flatten().tolist()]
