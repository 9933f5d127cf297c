"""What the engine returns: one RequestOutput per prompt with `n` CompletionOutputs (vLLM names)."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

__all__ = ["CompletionOutput", "RequestMetrics", "RequestOutput"]


@dataclass(frozen=True, slots=True)
class CompletionOutput:
    """One sample. finish_reason is "stop" (EOS, stop token or stop string) or "length".

    stop_reason is the matched stop string or stop token id, None for EOS or length.
    logprobs, when asked for, holds per generated token a {token_id: logprob} dict.
    grammar_completed: for a request with structured_outputs, whether the text is a complete
    match of its grammar (False when max_tokens or a stop string cut it); None otherwise.
    """

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    stop_reason: str | int | None
    logprobs: tuple[dict[int, float], ...] | None = None
    seed: int = 0  # the seed this sample's draws were made from
    grammar_completed: bool | None = None


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """When a request's events happened, in seconds on the engine's clock (`LLMEngine.clock`).

    arrival_time: when it was queued (or the arrival time `add_request` was given);
    first_scheduled_time: start of the first step that computed any of its tokens;
    token_times: end of each step's forward pass that gave its first sample a token, in order
    (never empty: a request finishes on a token).

        arrival     first scheduled     token 0      token 1   ...   token n-1
        |-- queue_s --|                   |- tbt_s[0] -|            |
        |------------- ttft_s ------------|                         |
        |------------------------------- e2e_s ---------------------|
    """

    arrival_time: float
    first_scheduled_time: float
    token_times: tuple[float, ...]

    @property
    def queue_s(self) -> float:
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.arrival_time

    @property
    def e2e_s(self) -> float:
        return self.token_times[-1] - self.arrival_time

    @property
    def tbt_s(self) -> tuple[float, ...]:
        """Time between consecutive tokens (one fewer than the tokens)."""
        return tuple(b - a for a, b in pairwise(self.token_times))


@dataclass(frozen=True, slots=True)
class RequestOutput:
    """All samples of one prompt; num_cached_tokens is the prefix-cache hit at first admission;
    metrics: its latency record (None only from code that builds outputs by hand).

    prompt_logprobs (when asked, vLLM's shape): one entry per prompt token, None for the first
    token (nothing predicts it) and for tokens before a score's start
    (`LLMEngine.add_request(score_from=...)`), else {token_id: logprob} holding the prompt
    token's own log-probability and the top `SamplingParams.prompt_logprobs` ones.
    """

    request_id: int
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    num_cached_tokens: int
    outputs: tuple[CompletionOutput, ...]
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None
