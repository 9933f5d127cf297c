"""A sequence: one sample of one request, as the scheduler sees it.

Every field is written by the Scheduler only; the engine and runner read.

    token_ids: | prompt                      | generated        |
               | computed (KV in the pool)      | not yet computed |
               0                      num_computed_tokens   num_tokens
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from batchgen.engine.sampling_params import SamplingParams

__all__ = ["Sequence", "SequenceStatus"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    seq_id: int
    request_id: int
    sample_index: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    seed: int
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    # Prefix-cache hit (tokens) at the first admission; -1 until admitted.
    num_cached_tokens: int = -1
    # Tokens that existed when the sequence was last (re)admitted: everything below is prefill.
    num_prefill_tokens: int = 0
    admit_order: int = -1
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, float]] = field(default_factory=list)
    # The first prompt token whose log-probability is wanted (>= 1: the first token has none);
    # None when none is. Until the prompt is computed, its tokens from there on come with
    # logits, and so are computed, never taken from the prefix cache (set at construction).
    prompt_logprobs_start: int | None = None
    # Set by the scheduler when the sequence is added: the tokens that may end it (EOS and its
    # stop tokens) and the length at which it ends (max_tokens or max_model_len, the nearer).
    end_token_ids: frozenset[int] = frozenset()
    max_num_tokens: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
