"""The logits processors of the sampler's pipeline, each vectorized over the rows that use it.

Each function changes rows of a float logits tensor `x` [rows, vocab] in place, at the (row,
token) pairs it is given; rows that do not use a processor are not in its index and cost
nothing. The order they run in is the sampler's (`batchgen.engine.sampler`):

    allowed ids and bad words -> logit bias -> min_tokens -> penalties -> grammar mask ->
    temperature -> top-k / top-p / min-p -> sample

`bad_words_token_ids` tokenizes bad words as vLLM does, and `banned_bad_word_tokens` finds the
tokens a sequence's last generated tokens ban (Python over a few short lists, for the rows
with bad words only).

May import: torch, batchgen.engine.token_counts. No tokenizer object (a callable is passed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from batchgen.engine.token_counts import TokenHistory

__all__ = [
    "add_bias",
    "bad_words_token_ids",
    "ban_tokens",
    "banned_bad_word_tokens",
    "keep_only",
    "penalize",
]

_NEG_INF = float("-inf")


def keep_only(x: torch.Tensor, rows: torch.Tensor, row_of_id: torch.Tensor, ids: torch.Tensor) -> None:
    """allowed_token_ids: in each of `rows` every token but its allowed ones becomes -inf.
    `ids` lists the allowed ids of all rows, `row_of_id` the position in `rows` of each."""
    keep = torch.zeros(rows.shape[0], x.shape[1], dtype=torch.bool, device=x.device)
    keep[row_of_id, ids] = True
    x[rows] = x.index_select(0, rows).masked_fill(~keep, _NEG_INF)


def ban_tokens(x: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor) -> None:
    """Set x[rows[i], ids[i]] to -inf (bad words, min_tokens' EOS and stop tokens)."""
    x[rows, ids] = _NEG_INF


def add_bias(x: torch.Tensor, rows: torch.Tensor, ids: torch.Tensor, bias: torch.Tensor) -> None:
    """logit_bias: x[rows[i], ids[i]] += bias[i] (each (row, id) pair at most once)."""
    x.index_put_((rows, ids), bias.to(x.dtype), accumulate=True)


def penalize(
    x: torch.Tensor,
    rows: torch.Tensor,
    history: TokenHistory,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> None:
    """Presence, frequency (OpenAI's formula over generated tokens) and repetition (prompt and
    generated tokens, transformers' and vLLM's) penalties on `rows`, one value of each per row.

    Only the rows' seen tokens are read and written:

        logit = logit / repetition  if logit > 0 else logit * repetition     (seen tokens)
        logit = logit - frequency * count - presence * (count > 0)           (count: generated)
    """
    ids = history.ids
    values = x[rows[:, None], ids]
    penalty = repetition.to(x.dtype)[:, None]
    values_new = torch.where(values > 0, values / penalty, values * penalty)
    counts = history.counts.to(x.dtype)
    values_new = values_new - frequency.to(x.dtype)[:, None] * counts
    values_new = values_new - presence.to(x.dtype)[:, None] * (counts > 0).to(x.dtype)
    # A row without tokens has no seen token: leave it as it was.
    values_new = torch.where(history.has_tokens[:, None], values_new, values)
    # Padding repeats a row's first seen id with its (equal) new value: duplicates agree.
    x[rows[:, None], ids] = values_new


def bad_words_token_ids(
    bad_words: Sequence[str], encode: Callable[[str], list[int]]
) -> tuple[tuple[int, ...], ...]:
    """The token sequences to ban, as vLLM builds them: each word with its leading whitespace
    stripped, and again after a space when that gives a different first token and the same
    number of tokens (the word in mid-text). `encode` tokenizes without special tokens."""
    result: list[tuple[int, ...]] = []
    for word in bad_words:
        plain = tuple(encode(word.lstrip()))
        if not plain:
            continue
        result.append(plain)
        spaced = tuple(encode(" " + word.lstrip()))
        if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
            result.append(spaced)
    return tuple(result)


def banned_bad_word_tokens(
    token_ids: Sequence[int], num_prompt_tokens: int, words: Sequence[tuple[int, ...]]
) -> list[int]:
    """The last tokens of the bad words whose other tokens the generated tokens end with (a
    one-token word is always banned). Only generated tokens count, as in vLLM."""
    num_generated = len(token_ids) - num_prompt_tokens
    banned: list[int] = []
    for word in words:
        prefix = len(word) - 1
        if prefix > num_generated:
            continue
        if prefix == 0 or tuple(token_ids[len(token_ids) - prefix :]) == word[:-1]:
            banned.append(word[-1])
    return banned
