"""Per-sequence grammar matchers: the one owner of structured output's row state, keyed by seq_id.

    add(seq_id, grammar)      a constrained sequence joins (its matcher is made at first use)
    fill_bitmask(targets)     the next-token bitmasks of these sequences (a mask thread may run it)
    advance(seq_id, token)    the sampled token moves the sequence's matcher on
    is_complete(seq_id)       the grammar admits nothing more (the row is finished)
    release(seq_id)           forget it

A matcher remembers how many generated tokens it consumed and the last one. Before a mask is
filled, a matcher that disagrees with its sequence's tokens (a preempted sequence recomputed,
a step whose sampled tokens did not reach `advance`) is rebuilt from those tokens: a fresh copy
of the grammar's start state that consumes the sequence's generated tokens. So the state always
follows the tokens, never the engine's history.

Threads: `fill_bitmask` may run on another thread while the owner's thread runs the forward
pass (llguidance releases the GIL and fills rows in parallel on its own threads); no other
method may run until it returns. The returned bitmask is a view of a buffer reused by the next
call. May import: torch, llguidance, batchgen.engine.structured.grammar.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from batchgen.engine.structured.grammar import CompiledGrammar, GrammarTokenizer

if TYPE_CHECKING:
    import llguidance

__all__ = ["GrammarMatchers", "GrammarTarget", "default_mask_threads"]


def default_mask_threads() -> int:
    """Threads llguidance fills masks with: half the CPUs (the forward pass keeps the rest),
    at least 1, at most 16."""
    return max(1, min(16, (os.cpu_count() or 2) // 2))


@dataclass(frozen=True, slots=True)
class GrammarTarget:
    """A sequence that draws a token this step: its tokens (prompt then generated; read, never
    kept, and not changed until the fill returns), where the generated ones start, and whether
    it ignores EOS (its EOS bits are then cleared while its grammar can go on)."""

    seq_id: int
    token_ids: Sequence[int]
    num_prompt_tokens: int
    ignore_eos: bool = False


class _Row:
    __slots__ = ("grammar", "last_token", "matcher", "num_consumed")

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
        self.matcher: llguidance.LLMatcher | None = None
        self.num_consumed = 0
        self.last_token = -1


class GrammarMatchers:
    """Matchers of the constrained sequences. `num_threads`: llguidance's fill threads
    (default `default_mask_threads()`). Counters: `num_rebuilds` (matchers rebuilt from tokens),
    `num_rejected` (sampled tokens a matcher refused)."""

    def __init__(self, tokenizer: GrammarTokenizer, *, num_threads: int | None = None) -> None:
        import llguidance

        self.tokenizer = tokenizer
        self._rows: dict[int, _Row] = {}
        self._executor = llguidance.LLExecutor(num_threads=num_threads or default_mask_threads())
        self._words = (tokenizer.vocab_size + 31) // 32
        self._buffer = torch.zeros(0, self._words, dtype=torch.int32)
        self.num_rebuilds = 0
        self.num_rejected = 0

    def __contains__(self, seq_id: object) -> bool:
        return seq_id in self._rows

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, seq_id: int, grammar: CompiledGrammar) -> None:
        """A constrained sequence (with no generated token yet, or rebuilt at its first fill).
        Raises ValueError if it is already tracked."""
        if seq_id in self._rows:
            raise ValueError(f"sequence {seq_id} already has a grammar matcher")
        self._rows[seq_id] = _Row(grammar)

    def release(self, seq_id: int) -> None:
        """Forget a sequence (no-op if untracked)."""
        self._rows.pop(seq_id, None)

    def fill_bitmask(self, targets: Sequence[GrammarTarget]) -> torch.Tensor:
        """int32 [len(targets), words] on the CPU: row i allows the tokens targets[i] may draw
        next (EOS only where its grammar accepts). Rebuilds disagreeing matchers first. The
        result is a view of a buffer that the next call overwrites."""
        if self._buffer.shape[0] < len(targets):
            self._buffer = torch.zeros(max(len(targets), 2 * self._buffer.shape[0]), self._words, dtype=torch.int32)
        bitmask = self._buffer[: len(targets)]
        pairs = [(self._synced(t), i) for i, t in enumerate(targets)]
        if pairs:
            # llguidance.torch wraps this call, but importing it runs torch.compile's imports.
            row_bytes = 4 * self._words
            self._executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), row_bytes, len(pairs))
        return bitmask

    def advance(self, seq_id: int, token: int) -> bool:
        """The sequence drew `token`: move its matcher on. False when the grammar refuses it
        (counted in `num_rejected`; the matcher then allows only EOS)."""
        row = self._rows[seq_id]
        if row.matcher is None:
            raise RuntimeError(f"sequence {seq_id} advanced before its grammar mask was filled")
        ok = bool(row.matcher.consume_token(token))
        row.num_consumed += 1
        row.last_token = token
        if not ok:
            self.num_rejected += 1
        return ok

    def is_complete(self, seq_id: int) -> bool:
        """True when the grammar admits no further token but EOS (or the matcher failed)."""
        matcher = self._rows[seq_id].matcher
        return matcher is not None and bool(matcher.is_stopped())

    def is_accepting(self, seq_id: int) -> bool:
        """True when the output so far is a complete match (the grammar may also go on)."""
        row = self._rows[seq_id]
        if row.matcher is None:
            row.matcher = row.grammar.new_matcher()
        return bool(row.matcher.is_accepting()) and not row.matcher.is_error()

    def _synced(self, target: GrammarTarget) -> llguidance.LLMatcher:
        """The target's matcher, rebuilt from its generated tokens when it disagrees with them."""
        row = self._rows[target.seq_id]
        tokens = target.token_ids
        num_generated = len(tokens) - target.num_prompt_tokens
        agrees = (
            row.matcher is not None
            and row.num_consumed == num_generated
            and (num_generated == 0 or tokens[-1] == row.last_token)
        )
        if agrees:
            assert row.matcher is not None
            return row.matcher
        if row.matcher is not None:
            self.num_rebuilds += 1
        matcher = row.grammar.new_matcher()
        generated = list(tokens[target.num_prompt_tokens :])
        if generated:
            matcher.consume_tokens(generated)
        row.matcher = matcher
        row.num_consumed = num_generated
        row.last_token = generated[-1] if generated else -1
        return matcher
