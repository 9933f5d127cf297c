"""The grammar mask as a logits processor: packed token bitmasks applied to logits rows.

A bitmask row is int32 words, llguidance's (and xgrammar's) layout: bit j of word w allows
token 32 w + j; tokens past the mask's width are never allowed.

    apply_grammar_mask(x, rows, bitmask)   x[rows[i], t] = -inf where bitmask[i] bans t
    unpack_bitmask(bitmask, vocab)         bool [rows, vocab] (the reference; tests, one row)

The sampler runs it at the pipeline's grammar slot (after the penalties, before temperature);
the engine fills the bitmasks while the forward pass runs. The packed words go to the compiled
CPU op (`batchgen.kernels.apply_token_bitmask`), which reads them directly: unpacking a step's
[64, 49152] masks to bool and filling by them cost about 30 ms on one core. May import: torch,
batchgen.kernels.
"""

from __future__ import annotations

import torch

from batchgen.kernels import apply_token_bitmask, unpack_bitmask

__all__ = ["apply_grammar_mask", "unpack_bitmask"]


def apply_grammar_mask(x: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> list[int]:
    """In place: every token of row rows[i] of `x` [num_rows, vocab] that bitmask[i] (int32
    [len(rows), words]) does not allow becomes -inf. Returns the positions i whose row has no
    logit above -inf left (another processor banned every token the grammar allows)."""
    empty = apply_token_bitmask(x, rows.to(torch.int64), bitmask)
    return [int(i) for i in torch.nonzero(empty).flatten().tolist()]
