"""The frozen values that cross between the scheduler, the runner and the sampler in one step.

`Scheduler.schedule()` returns a `StepPlan`; the runner turns it into tensors; the sampled tokens
come back to `Scheduler.update()` as a `StepResult`. None of them holds a live `Sequence`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from batchgen.radix import BlockCopy

__all__ = ["DecodeBatch", "ScheduledChunk", "StepPlan", "StepResult"]


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


class DecodeBatch(NamedTuple):
    """A step's plain decodes as columns: sequence i computes its one token `token_ids[i]` at
    position `start_pos[i]` with `block_tables[i]`, and draws its next token (one sample, seed
    `sample_seeds[i]`, the `num_generated_tokens[i]`-th it generates). The chunk of each is
    `ScheduledChunk(seq_ids[i], (token_ids[i],), start_pos[i], block_tables[i], 1,
    (sample_seeds[i],), num_generated_tokens[i])`.

    Most of a long job's steps are decodes of a few hundred sequences; columns are built with a
    few list comprehensions where one chunk per sequence cost a call and a tuple each, and the
    simulator reads them without building chunks at all.
    """

    seq_ids: tuple[int, ...] = ()
    token_ids: tuple[int, ...] = ()
    start_pos: tuple[int, ...] = ()
    block_tables: tuple[tuple[int, ...], ...] = ()
    sample_seeds: tuple[int, ...] = ()
    num_generated_tokens: tuple[int, ...] = ()

    def as_chunks(self) -> tuple[ScheduledChunk, ...]:
        return tuple(
            ScheduledChunk(seq_id, (token,), pos, table, 1, (seed,), generated)
            for seq_id, token, pos, table, seed, generated in zip(*self, strict=True)
        )


_NO_DECODES = DecodeBatch()


@dataclass(frozen=True, slots=True, init=False)
class StepPlan:
    """What one step computes, and the KV block copies to apply before its forward pass.

    The chunks come in two forms: `decodes`, the plain decodes as columns, and `listed`, every
    other chunk one by one (a prompt's chunk, a recompute, a sequence's first token; in a plan
    built by hand, any chunk). `chunks` gives them all as `ScheduledChunk`s, decodes first.

    Its work, counted once when it is made (the timeline and the simulator's cost model read
    them): num_tokens (tokens computed), num_sampling_chunks (chunks that draw a token),
    num_context_tokens (the KV each chunk's last query reads: start_pos + its tokens, summed) and
    num_attention_pairs (query-key pairs: each of a chunk's q queries reads start_pos keys and
    its own prefix)."""

    listed: tuple[ScheduledChunk, ...]
    block_copies: tuple[BlockCopy, ...]
    decodes: DecodeBatch
    num_tokens: int
    num_sampling_chunks: int
    num_context_tokens: int
    num_attention_pairs: int

    def __init__(
        self,
        chunks: tuple[ScheduledChunk, ...] = (),
        block_copies: tuple[BlockCopy, ...] = (),
        decodes: DecodeBatch = _NO_DECODES,
    ) -> None:
        """`chunks`: the chunks listed one by one (after `decodes` in the step's order)."""
        num_decodes = len(decodes.seq_ids)
        if any(len(column) != num_decodes for column in decodes):
            raise ValueError("a DecodeBatch's columns differ in length")
        # A decode at position s computes 1 token that reads s + 1 keys.
        positions = sum(decodes.start_pos)
        tokens, sampling = num_decodes, num_decodes
        context = pairs = positions + num_decodes
        for chunk in chunks:
            # | computed before: s | this chunk: q |
            s, q = chunk.start_pos, len(chunk.token_ids)
            tokens += q
            context += s + q
            pairs += q * s + q * (q + 1) // 2
            sampling += chunk.num_samples > 0
        set_ = object.__setattr__
        set_(self, "listed", chunks)
        set_(self, "block_copies", block_copies)
        set_(self, "decodes", decodes)
        set_(self, "num_tokens", tokens)
        set_(self, "num_sampling_chunks", sampling)
        set_(self, "num_context_tokens", context)
        set_(self, "num_attention_pairs", pairs)

    @property
    def chunks(self) -> tuple[ScheduledChunk, ...]:
        """Every chunk of the step, in order: the decodes', then the listed ones."""
        if not self.decodes.seq_ids:
            return self.listed
        return self.decodes.as_chunks() + self.listed

    @property
    def num_chunks(self) -> int:
        """Sequences the step computes (one chunk each)."""
        return len(self.decodes.seq_ids) + len(self.listed)

    @property
    def is_empty(self) -> bool:
        return not self.listed and not self.decodes.seq_ids


@dataclass(frozen=True, slots=True)
class StepResult:
    """The tokens a step sampled: `sampled[seq_id]` holds one token per sample of the chunk
    (chunk.num_samples of them); `logprobs[seq_id]`, when asked, one dict per token.

    `decode_tokens`, when given, holds the plain decodes' tokens as a column, in the order of
    `plan.decodes.seq_ids`, and `sampled` holds only the listed chunks' (a simulated step draws
    a column at once, where a dict of one-token tuples cost a tuple and an entry per sequence)."""

    sampled: Mapping[int, tuple[int, ...]]
    logprobs: Mapping[int, tuple[dict[int, float], ...]] | None = None
    # Sequences whose structured-output grammar is complete with this step's token: nothing
    # but EOS may follow, so they end with "stop", even on their max_tokens-th token.
    completed: frozenset[int] = frozenset()
    decode_tokens: Sequence[int] | None = None
