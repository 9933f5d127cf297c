"""Structured output inside the engine: compile at submission, masks while the forward pass runs.

`StructuredOutputs` is what `LLMEngine` holds: the tokenizer adapter and compile cache (built at
the first constrained request, so an engine that never sees one never imports llguidance), the
per-sequence matchers (`GrammarMatchers`, the one owner of that state) and one worker thread.
A step goes:

    start_masks(targets)        before the forward pass: the constrained sequences that draw a
                                token; their bitmasks are filled on the worker thread while
                                the model runs (an `ignore_eos` row's EOS bits cleared unless
                                EOS is all its grammar allows), or at once where the forward
                                pass leaves no core free (`overlap` False)
    pending.result(device)      after it: a `GrammarMask` for the sampler's grammar slot
    advance(seq_id, token)      each constrained sequence's sampled token
    is_complete(seq_id)         the grammar admits nothing more: the engine finishes the row

A step without constrained sequences starts nothing and costs nothing. Counters in `stats()`:
rows masked, the worker's fill time, and the time the step waited for it after the forward pass.

May import: torch, batchgen.tokenizer, batchgen.engine.structured.*. Never the scheduler or a
Sequence (targets come in as `GrammarTarget`s).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from batchgen.engine.structured.grammar import CompiledGrammar, GrammarCompiler, GrammarTokenizer
from batchgen.engine.structured.matchers import GrammarMatchers, GrammarTarget
from batchgen.engine.structured.params import StructuredOutputsParams
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = ["GrammarMask", "PendingMask", "StructuredOutputs", "StructuredStats"]


@dataclass(frozen=True, slots=True)
class GrammarMask:
    """The allowed tokens of one step's constrained sequences: `bitmask` int32 [k, words] on the
    logits' device (bit j of word w allows token 32 w + j), row i for sequence seq_ids[i]."""

    seq_ids: tuple[int, ...]
    bitmask: torch.Tensor


@dataclass(frozen=True, slots=True)
class StructuredStats:
    """num_masked_steps: steps with constrained rows; num_masked_rows: rows masked in all;
    fill_s: the worker's time filling masks; wait_s: the time steps waited for
    the worker after their forward pass (what the masks cost a step's latency)."""

    num_masked_steps: int
    num_masked_rows: int
    fill_s: float
    wait_s: float
    num_compiled: int
    num_cache_hits: int
    num_rebuilds: int
    num_rejected: int


class PendingMask:
    """Masks being filled on the worker thread; `result` waits for them."""

    def __init__(self, owner: StructuredOutputs, seq_ids: tuple[int, ...], future: Future[torch.Tensor]) -> None:
        self._owner = owner
        self.seq_ids = seq_ids
        self._future = future

    def result(self, device: torch.device) -> GrammarMask:
        """The masks on `device` (waits for the worker; re-raises its exception)."""
        t = time.perf_counter()
        bitmask = self._future.result()
        self._owner._waited(time.perf_counter() - t)
        return GrammarMask(self.seq_ids, bitmask.to(device))


class StructuredOutputs:
    """The engine's structured-output state. `vocab_size`: the logits' width; `eos_token_ids`:
    the model's. Not thread-safe beyond its own worker: the engine's thread calls every method."""

    def __init__(self, tokenizer: Tokenizer, *, vocab_size: int, eos_token_ids: Collection[int]) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._eos_token_ids = tuple(sorted(eos_token_ids))
        self._compiler: GrammarCompiler | None = None
        self._matchers: GrammarMatchers | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._num_masked_steps = 0
        self._num_masked_rows = 0
        self._fill_s = 0.0
        self._wait_s = 0.0

    # ------------------------------------------------------------ requests
    def compile(self, params: StructuredOutputsParams) -> CompiledGrammar:
        """The compiled grammar (cached by canonical text). Raises StructuredOutputError with the
        grammar engine's reason."""
        if self._compiler is None:
            adapter = GrammarTokenizer(self._tokenizer, vocab_size=self.vocab_size, eos_token_ids=self._eos_token_ids)
            self._compiler = GrammarCompiler(adapter)
            self._matchers = GrammarMatchers(adapter)
        return self._compiler.compile(params)

    def add(self, seq_id: int, grammar: CompiledGrammar) -> None:
        assert self._matchers is not None, "compile() comes first"
        self._matchers.add(seq_id, grammar)

    def release(self, seq_id: int) -> None:
        if self._matchers is not None:
            self._matchers.release(seq_id)

    @property
    def num_constrained(self) -> int:
        """Constrained sequences tracked now (0: a step has no mask to fill)."""
        return 0 if self._matchers is None else len(self._matchers)

    def is_constrained(self, seq_id: int) -> bool:
        return self._matchers is not None and seq_id in self._matchers

    # ---------------------------------------------------------------- step
    def start_masks(self, targets: Sequence[GrammarTarget], *, overlap: bool = True) -> PendingMask | None:
        """Fill the targets' masks on the worker thread (None, and nothing started, for none).
        No other method may run until the result is taken. overlap False: fill them now, on
        this thread (a CPU forward pass that uses every core: a fill beside it takes a core
        from its threads, which then wait for each other at every op; measured on 2 cores,
        batch 64: 0.6-0.75x the unconstrained tokens/s overlapped, against a fill of 5-10 ms
        a step done first)."""
        if not targets:
            return None
        assert self._matchers is not None
        if not overlap:
            self._num_masked_steps += 1
            self._num_masked_rows += len(targets)
            done: Future[torch.Tensor] = Future()
            done.set_result(self._fill(list(targets)))
            return PendingMask(self, tuple(t.seq_id for t in targets), done)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchgen-grammar")
        self._num_masked_steps += 1
        self._num_masked_rows += len(targets)
        future = self._worker.submit(self._fill, list(targets))
        return PendingMask(self, tuple(t.seq_id for t in targets), future)

    def _fill(self, targets: list[GrammarTarget]) -> torch.Tensor:
        t = time.perf_counter()
        assert self._matchers is not None
        # A copy: the matchers' buffer is reused by the next fill.
        bitmask = self._matchers.fill_bitmask(targets).clone()
        for i, target in enumerate(targets):
            if target.ignore_eos:
                self._clear_eos(bitmask[i])
        self._fill_s += time.perf_counter() - t
        return bitmask

    def _clear_eos(self, row: torch.Tensor) -> None:
        """An `ignore_eos` row may not end while its grammar can go on: clear its EOS bits,
        unless EOS is all the grammar allows (the grammar is complete; the row ends there)."""
        eos = [t for t in self._eos_token_ids if t < 32 * row.shape[0]]
        if not eos:
            return
        saved = row.clone()
        for token in eos:
            word = token // 32
            bits = int(row[word]) & ~(1 << (token % 32)) & 0xFFFFFFFF
            row[word] = bits - (1 << 32) if bits >= 1 << 31 else bits
        if not bool(row.any()):
            row.copy_(saved)

    def _waited(self, seconds: float) -> None:
        self._wait_s += seconds

    def advance(self, seq_id: int, token: int) -> bool:
        """A constrained sequence drew `token`; False when its grammar refuses it."""
        assert self._matchers is not None
        return self._matchers.advance(seq_id, token)

    def is_complete(self, seq_id: int) -> bool:
        """The sequence is constrained and its grammar admits nothing more but EOS."""
        return self.is_constrained(seq_id) and self._matchers is not None and self._matchers.is_complete(seq_id)

    def is_accepting(self, seq_id: int) -> bool:
        """The constrained sequence's output so far is a complete match."""
        assert self._matchers is not None
        return self._matchers.is_accepting(seq_id)

    def stats(self) -> StructuredStats:
        compiler, matchers = self._compiler, self._matchers
        return StructuredStats(
            num_masked_steps=self._num_masked_steps,
            num_masked_rows=self._num_masked_rows,
            fill_s=self._fill_s,
            wait_s=self._wait_s,
            num_compiled=0 if compiler is None else compiler.num_compiled,
            num_cache_hits=0 if compiler is None else compiler.num_cache_hits,
            num_rebuilds=0 if matchers is None else matchers.num_rebuilds,
            num_rejected=0 if matchers is None else matchers.num_rejected,
        )
