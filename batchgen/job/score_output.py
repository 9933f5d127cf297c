"""Output rows of scoring requests: a ``task: score`` row's score, and the prompt an OpenAI
``echo`` request repeats (with its token log-probabilities when asked).

A score row has finish_reason "scored", no text, ``usage.prompt_tokens`` the prompt's tokens
and ``usage.completion_tokens`` the tokens scored. An OpenAI echo with max_tokens 0 answers
with its prompt only: finish_reason "length" (OpenAI's), no generated tokens.

May import: batchgen.engine (outputs, scoring), batchgen.io, batchgen.job.prepare.
"""

from __future__ import annotations

from batchgen.engine.outputs import RequestOutput
from batchgen.engine.scoring import score_output
from batchgen.io import EchoPrompt, OutputRow
from batchgen.job.prepare import PreparedRow

__all__ = ["echo_prompt", "score_output_row"]


def echo_prompt(row: PreparedRow, out: RequestOutput) -> EchoPrompt | None:
    """The prompt to echo for an OpenAI ``echo`` row (None for any other row)."""
    if row.echo_text is None:
        return None
    tokens = out.prompt_token_ids
    entries = out.prompt_logprobs
    k = row.params.prompt_logprobs if row.params is not None else None
    if entries is None or k is None:  # no logprobs asked
        return EchoPrompt(text=row.echo_text, token_ids=tokens)
    own: list[float | None] = [None]
    top: list[tuple[tuple[int, float], ...] | None] = [None]
    for token, entry in zip(tokens[1:], entries[1:], strict=True):
        if entry is None:
            raise RuntimeError(f"request {out.request_id}: a prompt token has no logprob")
        own.append(entry[token])
        top.append(tuple(sorted(entry.items(), key=lambda kv: -kv[1])[:k]) if k else ())
    return EchoPrompt(
        text=row.echo_text, token_ids=tokens, logprobs=tuple(own), top_logprobs=tuple(top) if k else None
    )


def score_output_row(row: PreparedRow, out: RequestOutput, *, include_token_ids: bool) -> OutputRow:
    """The one output row of a score request (`row.score_from` set)."""
    assert row.score_from is not None
    seed = out.outputs[0].seed
    echo = echo_prompt(row, out)
    if echo is not None:
        return OutputRow(
            id=row.id,
            sample_index=0,
            passthrough=row.passthrough,
            output="",
            finish_reason="length",
            stop_reason=None,
            prompt_tokens=len(out.prompt_token_ids),
            completion_tokens=0,
            cached_tokens=out.num_cached_tokens,
            error_code=None,
            error_message=None,
            seed=seed,
            output_token_ids=() if include_token_ids else None,
            echo=echo,
        )
    score = score_output(out, row.score_from)
    return OutputRow(
        id=row.id,
        sample_index=0,
        passthrough=row.passthrough,
        output=None,
        finish_reason="scored",
        stop_reason=None,
        prompt_tokens=row.score_from,
        completion_tokens=score.num_tokens,
        cached_tokens=out.num_cached_tokens,
        error_code=None,
        error_message=None,
        seed=seed,
        output_token_ids=score.completion_token_ids if include_token_ids else None,
        score_token_logprobs=score.token_logprobs,
    )
