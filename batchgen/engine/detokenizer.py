"""Incremental detokenization and stop-string matching for one generated sequence.

Each update decodes only a short window (the tokens of the previous piece of text plus the new
ones, so that multi-byte characters and merged spaces come out right) and searches for stop
strings only in the new text plus the `max stop length - 1` characters before it, so the cost
per token does not grow with the output. Text waits while the window ends in an incomplete
UTF-8 sequence, for at most `_MAX_HELD_TOKENS` tokens; `finish` flushes what is still held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["Decoder", "IncrementalDetokenizer"]

# A UTF-8 character spans at most 4 bytes, so at most 4 byte tokens; past this many held
# tokens the bytes cannot complete a character and are emitted (as U+FFFD, like a full decode).
_MAX_HELD_TOKENS = 8


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Accumulates the text of generated tokens; reports the first stop string that appears.

    token ids:  | done | prefix window | unread (held) |
                0   prefix_offset  read_offset       len

    After a stop string matched (`stop_string`), the text ends just before it (just after it
    with `include_stop_str`) and further updates are ignored. Stop strings are searched only
    once more than `min_tokens` tokens came (vLLM's rule: a string completed by the first
    `min_tokens` tokens never stops). `skip_special_tokens` is passed to every decode.
    """

    __slots__ = (
        "_decoder",
        "_include_stop_str",
        "_max_stop_len",
        "_min_tokens",
        "_num_chars",
        "_pieces",
        "_prefix_offset",
        "_read_offset",
        "_skip_special_tokens",
        "_stop",
        "_tail",
        "_token_ids",
        "stop_string",
    )

    def __init__(
        self,
        decoder: Decoder,
        stop: tuple[str, ...],
        *,
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
        include_stop_str: bool = False,
    ) -> None:
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
        self._min_tokens = min_tokens
        self._include_stop_str = include_stop_str
        self._stop = stop
        self._max_stop_len = max((len(s) for s in stop), default=0)
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._pieces: list[str] = []
        self._num_chars = 0
        self._tail = ""  # the last max_stop_len - 1 characters of the text
        self.stop_string: str | None = None

    @property
    def text(self) -> str:
        """The text so far (without held-back bytes; cut before a matched stop string)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def update(self, new_token_ids: Sequence[int]) -> str | None:
        """Feed the tokens generated since the last call; returns the stop string that this
        update completed, if any (then `text` is cut just before it)."""
        if self.stop_string is not None:
            return None
        self._token_ids.extend(new_token_ids)
        return self._emit(final=False)

    def finish(self) -> str | None:
        """The sequence ended: flush held-back tokens (an incomplete UTF-8 sequence becomes
        U+FFFD, as in a full decode). Returns a stop string that the flushed text completed."""
        if self.stop_string is not None or self._read_offset == len(self._token_ids):
            return None
        return self._emit(final=True)

    def _emit(self, *, final: bool) -> str | None:
        window = self._token_ids[self._prefix_offset :]
        num_prefix = self._read_offset - self._prefix_offset
        skip = self._skip_special_tokens
        prefix_text = self._decoder.decode(window[:num_prefix], skip_special_tokens=skip)
        new_text = self._decoder.decode(window, skip_special_tokens=skip)
        num_held = len(self._token_ids) - self._read_offset
        if not final and new_text.endswith("\ufffd") and num_held < _MAX_HELD_TOKENS:
            return None  # an incomplete UTF-8 sequence: wait for its other bytes
        # Tokens without text (skipped special tokens) are read at once and stay as context.
        delta = new_text[len(prefix_text) :]
        if delta or num_prefix > _MAX_HELD_TOKENS:
            # Keep the previous piece's tokens as context, unless a long run of tokens without
            # text (special tokens) would grow the window without bound.
            self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return self._append(delta)

    def _append(self, delta: str) -> str | None:
        if not delta:
            return None
        window = self._tail + delta
        window_start = self._num_chars - len(self._tail)  # text index of window[0]
        self._pieces.append(delta)
        self._num_chars += len(delta)
        if self._max_stop_len > 1:
            self._tail = window[-(self._max_stop_len - 1) :]
        if len(self._token_ids) <= self._min_tokens:
            return None
        best: tuple[int, str] | None = None
        for stop in self._stop:
            idx = window.find(stop)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        cut = window_start + best[0] + (len(best[1]) if self._include_stop_str else 0)
        self._pieces = [self.text[:cut]]
        self._num_chars = cut
        self.stop_string = best[1]
        return best[1]
