"""Per-step attention metadata for a flat batch of sequences.

A step's tokens are laid out sequence after sequence:

    tokens:  | seq 0 chunk | seq 1 chunk | ... |      query_start_loc[s] .. query_start_loc[s+1]
    seq s:   | cached / computed earlier | this chunk |   seq_lens[s] = context + chunk length

Query token i of sequence s sits at absolute position seq_lens[s] - q_len[s] + i and attends to
positions 0 .. that position (its cached prefix plus the causal part of its own chunk), read from
the KV pool through block_tables[s]. The chunk's own K/V are written to the pool before attention.

This module imports torch only; nothing of batchgen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AttentionMetadata"]


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Tensors on the model's device plus host copies of the small per-sequence lists.

    query_start_loc: int32 [num_seqs + 1], prefix sums of query lengths.
    seq_lens: int32 [num_seqs], tokens in each sequence's KV after this step.
    block_tables: int32 [num_seqs, max_blocks_per_seq], padded with 0.
    slot_mapping: int64 [num_tokens], pool slot (block_id * block_size + offset) of each token.
    The host lists (`query_lens_host`, `seq_lens_host`) let the PyTorch path slice without
    device synchronisation.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    query_lens_host: tuple[int, ...]
    seq_lens_host: tuple[int, ...]
    max_query_len: int
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_host)

    @property
    def is_all_decode(self) -> bool:
        return self.max_query_len == 1
