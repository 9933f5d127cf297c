"""Flat step arrays built from a StepPlan: a pure function over Python lists (no torch).

All scheduled tokens are laid out sequence after sequence:

    input_ids:        | seq 0 chunk | seq 1 chunk | ... |
    query_start_loc:  0             q0            q0+q1  ...
    positions:        start_pos .. start_pos + len(chunk) - 1, per sequence
    slot_mapping:     block_table[pos // block_size] * block_size + pos % block_size
    logits_indices:   flat index of the last token of each chunk that samples
    prompt_logits_indices: flat indices of the positions whose logits give prompt logprobs
                      (a chunk's positions from `prompt_logits_start` on, but its sampling one),
                      one `PromptLogitsSpan` per chunk that has any
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from batchgen.engine.step_plan import ScheduledChunk

__all__ = ["PromptLogitsSpan", "StepArrays", "build_step_arrays"]


@dataclass(frozen=True, slots=True)
class PromptLogitsSpan:
    """`num_positions` consecutive prompt-logits rows of sequence `seq_id`, for its positions
    from `start_pos` on (position p's logits give the log-probability of token p + 1)."""

    seq_id: int
    start_pos: int
    num_positions: int


@dataclass(frozen=True, slots=True)
class StepArrays:
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    query_start_loc: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]  # padded with 0 to the longest table
    logits_indices: list[int]
    sampling_seq_ids: list[int]  # seq_id of each logits row
    prompt_logits_indices: list[int] = field(default_factory=list)
    prompt_logits_spans: list[PromptLogitsSpan] = field(default_factory=list)


def build_step_arrays(chunks: Sequence[ScheduledChunk], block_size: int) -> StepArrays:
    """Raises ValueError if a chunk's positions run past its block table."""
    input_ids: list[int] = []
    positions: list[int] = []
    slot_mapping: list[int] = []
    query_start_loc = [0]
    query_lens: list[int] = []
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    sampling_seq_ids: list[int] = []
    prompt_logits_indices: list[int] = []
    prompt_logits_spans: list[PromptLogitsSpan] = []
    max_blocks = max((len(c.block_table) for c in chunks), default=0)
    block_tables: list[list[int]] = []
    for chunk in chunks:
        num_new = len(chunk.token_ids)
        end = chunk.start_pos + num_new
        if end > len(chunk.block_table) * block_size:
            raise ValueError(
                f"sequence {chunk.seq_id}: positions up to {end} need more than "
                f"{len(chunk.block_table)} blocks of {block_size}"
            )
        input_ids.extend(chunk.token_ids)
        for pos in range(chunk.start_pos, end):
            positions.append(pos)
            slot_mapping.append(chunk.block_table[pos // block_size] * block_size + pos % block_size)
        query_start_loc.append(query_start_loc[-1] + num_new)
        query_lens.append(num_new)
        seq_lens.append(end)
        block_tables.append(list(chunk.block_table) + [0] * (max_blocks - len(chunk.block_table)))
        if chunk.num_samples > 0:
            logits_indices.append(query_start_loc[-1] - 1)
            sampling_seq_ids.append(chunk.seq_id)
        if chunk.prompt_logits_start is not None:
            # | before start | prompt logits rows ... | sampling position (if it samples) |
            first = max(chunk.start_pos, chunk.prompt_logits_start)
            last = end - 1 if chunk.num_samples > 0 else end
            if last > first:
                flat = query_start_loc[-2] - chunk.start_pos
                prompt_logits_indices.extend(range(flat + first, flat + last))
                prompt_logits_spans.append(PromptLogitsSpan(chunk.seq_id, first, last - first))
    return StepArrays(
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        query_lens=query_lens,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=logits_indices,
        sampling_seq_ids=sampling_seq_ids,
        prompt_logits_indices=prompt_logits_indices,
        prompt_logits_spans=prompt_logits_spans,
    )
