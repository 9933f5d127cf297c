"""Per-sequence token statistics for the penalties, kept on the logits' device and keyed by seq_id.

Owns, for each sequence that asks for a presence, frequency or repetition penalty, one slot of:

    counts[slot, token]   int32  times the sequence generated `token`
    seen[slot, token]     bool   `token` is in the prompt or was generated
    seen_ids[slot, :k]    int64  the seen tokens in first-seen order, k = num_seen[slot]

`seen_ids` is the sparse index the penalties read: a step touches each row's k seen tokens,
not the whole vocabulary. After a draw, `add` counts the drawn tokens with one scatter over
the rows (no loop over rows, no recount of the history). An entry records how many generated
tokens it counted; when that differs from the sequence's (a new sequence, or one that was
preempted and recomputed after its slot was taken back), `lookup` rebuilds the slot from the
sequence's tokens. So the state never has to be told about preemption: it is checked, and
rebuilt from tokens, at each use.

Slots are reused after `release` (a finished sequence) and taken back from entries no request
of the current step used when the pool is full (a preempted sequence rebuilds on return);
the pool doubles only when every slot is in use by the step.

May import: torch. Nothing else of batchgen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = ["TokenCounts", "TokenHistory"]


@dataclass(frozen=True, slots=True)
class TokenHistory:
    """What a penalty row reads: for each row its seen tokens `ids` [rows, width] (a row with
    fewer than `width` seen tokens repeats its first one, so a scatter of per-token results
    stays deterministic), how often each was generated, `counts` [rows, width] (0 for a token
    only in the prompt), and `has_tokens` [rows] (False for a row without any token, whose
    `ids` mean nothing)."""

    ids: torch.Tensor
    counts: torch.Tensor
    has_tokens: torch.Tensor


@dataclass(slots=True)
class _Entry:
    slot: int
    num_counted: int  # generated tokens counted in the slot
    last_used: int  # the `lookup` call that last used it


class TokenCounts:
    """Slots of token statistics on `device` for a vocabulary of `vocab_size` tokens; not
    thread-safe (the engine's step thread owns it)."""

    def __init__(self, vocab_size: int, device: torch.device, initial_slots: int = 8) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._entries: dict[int, _Entry] = {}
        self._free: list[int] = []
        self._num_slots = 0
        self._width = 0
        self._calls = 0
        self._counts = torch.zeros(0, vocab_size, dtype=torch.int32, device=device)
        self._seen = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self._seen_ids = torch.zeros(0, 0, dtype=torch.int64, device=device)
        self._num_seen = torch.zeros(0, dtype=torch.int64, device=device)
        self._grow_slots(initial_slots)
        self._grow_width(64)

    @property
    def num_entries(self) -> int:
        return len(self._entries)

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def seq_ids(self) -> frozenset[int]:
        """The sequences that hold a slot."""
        return frozenset(self._entries)

    def lookup(
        self, seq_ids: Sequence[int], token_ids: Sequence[Sequence[int]], num_prompt_tokens: Sequence[int]
    ) -> torch.Tensor:
        """The slots (int64 [rows], on the device) of these sequences, given each one's tokens
        (prompt then generated). An entry that is missing or counted another number of
        generated tokens is rebuilt from the tokens. Mutates the pool."""
        self._calls += 1
        needed = max(len(t) for t in token_ids) + 1  # room for the token drawn next
        if needed > self._width:
            self._grow_width(needed)
        slots: list[int] = []
        rebuild: list[int] = []
        for i, seq_id in enumerate(seq_ids):
            entry = self._entries.get(seq_id)
            num_generated = len(token_ids[i]) - num_prompt_tokens[i]
            if entry is None:
                entry = self._entries[seq_id] = _Entry(self._allocate(), -1, self._calls)
            entry.last_used = self._calls
            if entry.num_counted != num_generated:
                entry.num_counted = num_generated
                rebuild.append(i)
            slots.append(entry.slot)
        if rebuild:
            self._rebuild([slots[i] for i in rebuild], [token_ids[i] for i in rebuild],
                          [num_prompt_tokens[i] for i in rebuild])
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    def history(self, slots: torch.Tensor, max_tokens: int) -> TokenHistory:
        """The seen tokens and generated counts of these slots; `max_tokens` bounds how many
        tokens any of them has (prompt plus generated), so that the width is known without
        reading the device."""
        width = min(self._width, max(1, max_tokens))
        ids = self._seen_ids.index_select(0, slots)[:, :width]
        num_seen = self._num_seen.index_select(0, slots)
        valid = torch.arange(width, device=self.device)[None, :] < num_seen[:, None]
        ids = torch.where(valid, ids, ids[:, :1])
        counts = self._counts.view(-1).index_select(0, (slots[:, None] * self.vocab_size + ids).view(-1))
        return TokenHistory(ids=ids, counts=counts.view(ids.shape), has_tokens=num_seen > 0)

    def add(self, seq_ids: Sequence[int], slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count one drawn token per slot (int64 [rows] each; a slot appears once): one scatter
        over the rows. `seq_ids` are the slots' sequences, whose counted totals advance."""
        flat = slots * self.vocab_size + tokens
        seen = self._seen.view(-1)
        was_seen = seen.index_select(0, flat)
        seen.index_fill_(0, flat, True)
        self._counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        # Written at position num_seen whether new or not; only a new token advances num_seen,
        # so an old one's write lies past the end and is overwritten later.
        position = self._num_seen.index_select(0, slots)
        self._seen_ids[slots, position] = tokens
        self._num_seen.index_add_(0, slots, (~was_seen).to(torch.int64))
        for seq_id in seq_ids:
            self._entries[seq_id].num_counted += 1

    def release(self, seq_id: int) -> None:
        """Forget a sequence (finished); no-op for one without an entry."""
        entry = self._entries.pop(seq_id, None)
        if entry is not None:
            self._free.append(entry.slot)

    # ------------------------------------------------------------- internals
    def _allocate(self) -> int:
        if not self._free:
            # Take back the slots no request of this call uses (their sequences are preempted,
            # waiting, or skipped this step); they rebuild from their tokens when next used.
            for seq_id in [s for s, e in self._entries.items() if e.last_used != self._calls]:
                self.release(seq_id)
        if not self._free:
            self._grow_slots(2 * self._num_slots)
        return self._free.pop()

    def _grow_slots(self, num_slots: int) -> None:
        extra = num_slots - self._num_slots
        dev, vocab = self.device, self.vocab_size
        self._counts = torch.cat([self._counts, torch.zeros(extra, vocab, dtype=torch.int32, device=dev)])
        self._seen = torch.cat([self._seen, torch.zeros(extra, vocab, dtype=torch.bool, device=dev)])
        self._seen_ids = torch.cat([self._seen_ids, torch.zeros(extra, self._width, dtype=torch.int64, device=dev)])
        self._num_seen = torch.cat([self._num_seen, torch.zeros(extra, dtype=torch.int64, device=dev)])
        self._free.extend(range(num_slots - 1, self._num_slots - 1, -1))
        self._num_slots = num_slots

    def _grow_width(self, needed: int) -> None:
        width = max(needed, 2 * self._width)
        pad = torch.zeros(self._num_slots, width - self._width, dtype=torch.int64, device=self.device)
        self._seen_ids = torch.cat([self._seen_ids, pad], dim=1)
        self._width = width

    def _rebuild(self, slots: list[int], token_ids: list[Sequence[int]], num_prompt_tokens: list[int]) -> None:
        """Refill slots from their sequences' tokens: the one pass over a history, done when a
        sequence first needs its slot (or returns from preemption)."""
        index = torch.tensor(slots, dtype=torch.int64, device=self.device)
        self._counts.index_fill_(0, index, 0)
        self._seen.index_fill_(0, index, False)
        seen_rows: list[int] = []
        seen_cols: list[int] = []
        seen_vals: list[int] = []
        generated: list[int] = []
        num_seen: list[int] = []
        for slot, tokens, num_prompt in zip(slots, token_ids, num_prompt_tokens, strict=True):
            distinct = list(dict.fromkeys(tokens))
            seen_rows.extend([slot] * len(distinct))
            seen_cols.extend(range(len(distinct)))
            seen_vals.extend(distinct)
            generated.extend(slot * self.vocab_size + t for t in tokens[num_prompt:])
            num_seen.append(len(distinct))
        dev = self.device
        vals = torch.tensor(seen_vals, dtype=torch.int64, device=dev)
        rows = torch.tensor(seen_rows, dtype=torch.int64, device=dev)
        self._seen_ids[rows, torch.tensor(seen_cols, dtype=torch.int64, device=dev)] = vals
        self._seen.view(-1).index_fill_(0, rows * self.vocab_size + vals, True)
        self._num_seen[index] = torch.tensor(num_seen, dtype=torch.int64, device=dev)
        if generated:
            flat = torch.tensor(generated, dtype=torch.int64, device=dev)
            self._counts.view(-1).index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
