"""What `LLMEngine.add_request` checks and derives from a request's sampling parameters before
queueing it: limits that need the model (vocabulary, EOS ids), the bad words' token ids, the
first prompt token whose log-probability is computed, and that a row has something to draw.

Pure over Python values and an `encode` callable (the tokenizer without special tokens).

May import: batchgen.engine.sampling_params, batchgen.engine.logits_processors.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from batchgen.engine.logits_processors import bad_words_token_ids
from batchgen.engine.sampling_params import SamplingParams

__all__ = ["RequestSetup", "check_request"]


@dataclass(frozen=True, slots=True)
class RequestSetup:
    """score_from: the first prompt token index whose log-probability is computed (None: none);
    bad_words_token_ids: the token sequences `bad_words` bans."""

    score_from: int | None
    bad_words_token_ids: tuple[tuple[int, ...], ...]


def check_request(
    params: SamplingParams,
    num_prompt_tokens: int,
    *,
    vocab_size: int,
    eos_token_ids: Collection[int],
    encode: Callable[[str], list[int]],
    score_from: int | None,
) -> RequestSetup:
    """Raises ValueError naming the field when the request asks for more logprobs than the
    vocabulary holds, names token ids outside it, gives a score start outside the prompt, or
    bans every token it allows (a one-token bad word, or EOS or a stop token id while min_tokens
    masks them: the row would have nothing to draw)."""
    for name, k in (("logprobs", params.logprobs), ("prompt_logprobs", params.prompt_logprobs)):
        if k is not None and k > vocab_size:
            raise ValueError(f"SamplingParams.{name}={k} exceeds the vocabulary of {vocab_size} tokens")
    params.check_vocab(vocab_size)
    if score_from is None and params.prompt_logprobs is not None:
        score_from = 1
    if score_from is not None and not 1 <= score_from <= num_prompt_tokens:
        raise ValueError(
            f"score_from={score_from} must be in [1, {num_prompt_tokens}] (an index of the prompt's tokens)"
        )
    words = bad_words_token_ids(params.bad_words, encode) if params.bad_words else ()
    if params.allowed_token_ids is not None:
        banned = {w[0] for w in words if len(w) == 1}
        if params.min_tokens > 0:
            banned |= set(params.stop_token_ids) | (set() if params.ignore_eos else set(eos_token_ids))
        if set(params.allowed_token_ids) <= banned:
            raise ValueError(
                "SamplingParams.allowed_token_ids: every allowed token is banned (by bad_words, or as "
                "EOS or a stop token id before min_tokens)"
            )
    return RequestSetup(score_from=score_from, bad_words_token_ids=words)
