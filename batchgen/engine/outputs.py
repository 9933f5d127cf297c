"""What the engine returns: one RequestOutput per prompt with `n` CompletionOutputs (vLLM names)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CompletionOutput", "RequestOutput"]


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One sample. finish_reason is "stop" (EOS, stop token or stop string) or "length".

    stop_reason is the matched stop string or stop token id, None for EOS or length.
    logprobs, when asked for, holds per generated token a {token_id: logprob} dict.
    """

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    stop_reason: str | int | None
    logprobs: tuple[dict[int, float], ...] | None = None
    seed: int = 0  # the seed this sample's draws were made from


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """All samples of one prompt; num_cached_tokens is the prefix-cache hit at first admission."""

    request_id: int
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    num_cached_tokens: int
    outputs: tuple[CompletionOutput, ...]
