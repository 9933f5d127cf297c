"""Incremental detokenization and stop-string matching for one generated sequence.

Only the newest tokens are decoded each step (with a short window of earlier tokens so that
multi-byte characters and merged spaces come out right), so the cost per token is constant.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Decoder", "IncrementalDetokenizer"]


class Decoder(Protocol):
    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Accumulates text of generated tokens; reports the first stop string that appears.

    token ids:  | done | prefix window | unread |
                0   prefix_offset  read_offset  len
    """

    __slots__ = ("_decoder", "_max_stop_len", "_prefix_offset", "_read_offset", "_stop", "text")

    def __init__(self, decoder: Decoder, stop: tuple[str, ...]) -> None:
        self._decoder = decoder
        self._stop = stop
        self._max_stop_len = max((len(s) for s in stop), default=0)
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def update(self, token_ids: list[int]) -> str | None:
        """Feed all generated token ids so far; returns the matched stop string, if any.

        On a match `text` is cut just before the stop string.
        """
        prefix_text = self._decoder.decode(token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decoder.decode(token_ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return None  # an incomplete UTF-8 sequence or a skipped special token: wait
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(token_ids)
        self.text += delta
        if not self._stop:
            return None
        search_from = max(0, len(self.text) - len(delta) - self._max_stop_len + 1)
        best: tuple[int, str] | None = None
        for stop in self._stop:
            idx = self.text.find(stop, search_from)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        self.text = self.text[: best[0]]
        return best[1]
