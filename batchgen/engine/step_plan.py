"""The frozen values that cross between the scheduler, the runner and the sampler in one step.

`Scheduler.schedule()` returns a `StepPlan`; the runner turns it into tensors; the sampled tokens
come back to `Scheduler.update()` as a `StepResult`. None of them holds a live `Sequence`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from batchgen.radix import BlockCopy

__all__ = ["ScheduledChunk", "StepPlan", "StepResult"]


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """The tokens of one sequence that a step computes.

        | computed before | token_ids (this step) |
        0            start_pos          start_pos + len(token_ids)

    num_samples: 0 when the chunk ends before the sequence's last token (no sampling), 1 for a
    next token, n when the first token of an n-sample request is drawn (the other samples fork).
    sample_seeds: the seeds of those samples, in the order of `StepResult.sampled[seq_id]` (the
    sequence's own, then its forks'); empty when nothing samples. num_generated_tokens: tokens
    the sequence generated before this step (the index of the token it draws). Neither changes
    what the forward pass computes; a runner that picks tokens itself (the simulator's) reads them.
    prompt_logits_start: the chunk's positions from this one on (before its sampling position)
    also return their logits, for prompt logprobs; None: only the sampling position's.
    """

    seq_id: int
    token_ids: tuple[int, ...]
    start_pos: int
    block_table: tuple[int, ...]
    num_samples: int
    sample_seeds: tuple[int, ...] = ()
    num_generated_tokens: int = 0
    prompt_logits_start: int | None = None


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step computes, and the KV block copies to apply before its forward pass."""

    chunks: tuple[ScheduledChunk, ...]
    block_copies: tuple[BlockCopy, ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


@dataclass(frozen=True, slots=True)
class StepResult:
    """The tokens a step sampled: `sampled[seq_id]` holds one token per sample of the chunk
    (chunk.num_samples of them); `logprobs[seq_id]`, when asked, one dict per token."""

    sampled: Mapping[int, tuple[int, ...]]
    logprobs: Mapping[int, tuple[dict[int, float], ...]] | None = None
    # Sequences whose structured-output grammar is complete with this step's token: nothing
    # but EOS may follow, so they end with "stop", even on their max_tokens-th token.
    completed: frozenset[int] = frozenset()
