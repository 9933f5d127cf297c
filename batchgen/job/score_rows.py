"""The prepare stage's pieces for scoring rows (``task: score`` and OpenAI ``echo``).

A score row is one engine request of prompt + completion tokens with `score_from` = the
prompt's length: the engine computes the log-probability of every completion token and draws
nothing that is kept (`SCORE_PARAMS`: one greedy token, dropped). Here: the value checks of a
completion, the split of a chat into the prompt messages and the scored reply, and the length
policy of a pair (``prompt_too_long``):

    | prompt (kept whole, or cut on the left) | completion (kept whole, or cut on the right) |
    0                                   score_from                              <= max_model_len - 1

``error`` makes a pair longer than ``max_model_len - 1`` tokens an error row;
``truncate_left`` drops prompt tokens from its start (the completion stays whole);
``truncate_right`` drops completion tokens from its end (a prefix of it is scored); either
keeps at least one token of each, else the row is an error row.

Pure over Python values; imports batchgen.engine.sampling_params and batchgen.job.row_error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchgen.engine.sampling_params import SamplingParams
from batchgen.job.row_error import RowError

__all__ = ["SCORE_PARAMS", "ChatCompletion", "fit_score", "split_chat_completion"]

# What a score request samples: one greedy token after the last position, which is dropped.
SCORE_PARAMS = SamplingParams(max_tokens=1, temperature=0)


@dataclass(frozen=True, slots=True)
class ChatCompletion:
    """A chat to score: the messages the template renders as the prompt (with the generation
    prompt) and the text of the last, assistant message, which is scored."""

    prompt_messages: list[Any]
    completion: str


def split_chat_completion(value: Sequence[Any]) -> ChatCompletion | RowError:
    """The prompt messages and the scored reply of a chat, or an ``invalid_completion`` row."""
    if not value:
        return RowError("invalid_completion", "the completion chat has no messages")
    last = value[-1]
    if not isinstance(last, Mapping) or last.get("role") != "assistant":
        role = last.get("role") if isinstance(last, Mapping) else None
        return RowError(
            "invalid_completion", f"the completion chat must end with an assistant message, not {role!r}"
        )
    content = last.get("content")
    if not isinstance(content, str) or not content:
        return RowError("invalid_completion", "the completion chat's last message has no text to score")
    if len(value) < 2:
        return RowError("invalid_completion", "the completion chat has no message before the assistant's reply")
    return ChatCompletion(prompt_messages=list(value[:-1]), completion=content)


def fit_score(
    prompt_ids: list[int], completion_ids: list[int], *, max_model_len: int, policy: str
) -> tuple[list[int], list[int], RowError | None]:
    """Apply ``prompt_too_long`` to a pair (module docstring): the pair's tokens, or an error."""
    if not prompt_ids:
        return prompt_ids, completion_ids, RowError("invalid_prompt", "the prompt encodes to no tokens")
    if not completion_ids:
        return prompt_ids, completion_ids, RowError("invalid_completion", "the completion encodes to no tokens")
    limit = max_model_len - 1  # the engine draws one token after the last position
    total = len(prompt_ids) + len(completion_ids)
    if total <= limit:
        return prompt_ids, completion_ids, None
    if policy == "truncate_left" and len(completion_ids) < limit:
        return prompt_ids[total - limit :], completion_ids, None
    if policy == "truncate_right" and len(prompt_ids) < limit:
        return prompt_ids, completion_ids[: limit - len(prompt_ids)], None
    return prompt_ids, completion_ids, RowError(
        "prompt_too_long",
        f"the prompt and completion have {len(prompt_ids)} + {len(completion_ids)} tokens; "
        f"max_model_len={max_model_len} leaves room for {limit}"
        + ("" if policy == "error" else f" and {policy} cannot keep a token of each"),
    )
