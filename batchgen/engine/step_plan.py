"""The frozen values that cross between the scheduler, the runner and the sampler in one step.

`Scheduler.schedule()` returns a `StepPlan`; the runner turns it into tensors; the sampled tokens
come back to `Scheduler.update()` as a `StepResult`. None of them holds a live `Sequence`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from batchgen.radix import BlockCopy

__all__ = ["ScheduledChunk", "StepPlan", "StepResult"]


class ScheduledChunk(NamedTuple):
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

    A named tuple (immutable like the rest of the plan): a step makes one per running sequence,
    and a tuple is built in a quarter of a frozen dataclass's time, which a simulation of a
    million rows pays a few hundred million times.
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
    """What one step computes, and the KV block copies to apply before its forward pass.

    Its work, counted once when it is made (the timeline and the simulator's cost model read
    them): num_tokens (tokens computed), num_sampling_chunks (chunks that draw a token),
    num_context_tokens (the KV each chunk's last query reads: start_pos + its tokens, summed) and
    num_attention_pairs (query-key pairs: each of a chunk's q queries reads start_pos keys and
    its own prefix)."""

    chunks: tuple[ScheduledChunk, ...]
    block_copies: tuple[BlockCopy, ...]
    num_tokens: int = field(init=False)
    num_sampling_chunks: int = field(init=False)
    num_context_tokens: int = field(init=False)
    num_attention_pairs: int = field(init=False)

    def __post_init__(self) -> None:
        tokens = sampling = context = pairs = 0
        for chunk in self.chunks:
            # | computed before: s | this chunk: q |
            s, q = chunk.start_pos, len(chunk.token_ids)
            tokens += q
            context += s + q
            pairs += q * s + q * (q + 1) // 2
            sampling += chunk.num_samples > 0
        object.__setattr__(self, "num_tokens", tokens)
        object.__setattr__(self, "num_sampling_chunks", sampling)
        object.__setattr__(self, "num_context_tokens", context)
        object.__setattr__(self, "num_attention_pairs", pairs)

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
