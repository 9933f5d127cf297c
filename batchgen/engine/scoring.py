"""Scores: the log-likelihood of a completion given a prompt, from a request's prompt logprobs.

A score request is one prefill of prompt + completion with `score_from = len(prompt)`
(`LLMEngine.add_request`): the prompt's tokens may come from the prefix cache (pairs that share
a prompt share its KV), the completion's are computed with their logits, and nothing is
decoded (the one token the engine draws after the last position is dropped).

May import: batchgen.engine.outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from batchgen.engine.outputs import RequestOutput

__all__ = ["ScoreOutput", "score_output"]


@dataclass(frozen=True, slots=True)
class ScoreOutput:
    """One (prompt, completion) pair's score.

    token_logprobs: the natural-log probability of each completion token given everything
    before it; logprob_sum their sum; perplexity exp(-logprob_sum / num_tokens).
    num_cached_tokens: prompt tokens the prefix cache served.
    """

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    token_logprobs: tuple[float, ...]
    num_cached_tokens: int

    @property
    def num_tokens(self) -> int:
        return len(self.token_logprobs)

    @property
    def logprob_sum(self) -> float:
        return math.fsum(self.token_logprobs)

    @property
    def perplexity(self) -> float:
        return math.exp(-self.logprob_sum / self.num_tokens) if self.num_tokens else math.nan


def score_output(out: RequestOutput, score_from: int) -> ScoreOutput:
    """The score of a request added with `score_from` (its prompt logprobs from that index).
    Raises ValueError when the output lacks them."""
    entries = out.prompt_logprobs
    tokens = out.prompt_token_ids
    if entries is None or len(entries) != len(tokens):
        raise ValueError(f"request {out.request_id} has no prompt logprobs to score")
    values = []
    for idx in range(score_from, len(tokens)):
        entry = entries[idx]
        if entry is None:
            raise ValueError(f"request {out.request_id}: prompt token {idx} has no logprob")
        values.append(entry[tokens[idx]])
    return ScoreOutput(
        prompt_token_ids=tokens[:score_from],
        completion_token_ids=tokens[score_from:],
        token_logprobs=tuple(values),
        num_cached_tokens=out.num_cached_tokens,
    )
