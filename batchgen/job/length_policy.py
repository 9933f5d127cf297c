"""The prepare stage's length policy (``prompt_too_long``), bounded by max_model_len.

For a prompt longer than ``max_model_len - 1`` tokens: ``error`` makes it an error row;
``truncate_left`` / ``truncate_right`` keep the last / first ``max_model_len - max_tokens``
tokens, so that the whole generation fits, and give an error row when that leaves no room at
all. Chats are truncated by whole messages (the oldest non-system messages for
``truncate_left``, the newest ones for ``truncate_right``, leaving a user message last), so the
template's role headers, the generation prompt included, are never cut.

Bounded work. A token spans at most `chars_per_token` characters (the tokenizer's longest
token, times 4 when it has a normalizer, which may merge up to 4 characters into one), so a
text of more than ``max_prompt_chars = (max_model_len + TOKEN_MARGIN) x chars_per_token``
characters cannot fit:

- a text prompt that long is an error row at once (``error``), or is cut to that many
  characters before encoding (its end for ``truncate_left``, its start for ``truncate_right``);
  shorter prompts are encoded whole, exactly as before;
- a chat renders with its output capped at that bound (past it, it counts as too long), and
  each truncated candidate with its output capped at ``keep x chars_per_token``;
- the message-dropping search probes the first candidate, then binary-searches the others
  (O(log n) renders instead of n), which returns what the one-by-one scan returns when token
  counts do not grow as messages are dropped; when any probe's render fails it falls back to
  the one-by-one scan, which reports the first failure as before.

This assumes the tokenizer's pre-tokenizer drops no characters (true of byte-level BPE and
SentencePiece-style tokenizers). Pure over Python values and a tokenizer; imports
batchgen.tokenizer and batchgen.engine.sampling_params.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from batchgen.engine.sampling_params import SamplingParams
from batchgen.job.row_error import RowError
from batchgen.tokenizer.chat_template import ChatTemplateError, ChatTemplateTooLong
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = ["TOKEN_MARGIN", "LengthPolicy", "PolicyName", "chars_per_token"]

PolicyName = Literal["error", "truncate_left", "truncate_right"]
TOKEN_MARGIN = 64  # tokens of slack past max_model_len in the character bound

# Renders a chat (under the job's chat options) with its output capped at the given number of
# characters; raises ChatTemplateTooLong past it, ChatTemplateError when the template fails.
ChatRenderer = Callable[[list[Any], int], str]


def chars_per_token(tokenizer: Tokenizer) -> int:
    """The most characters of input one token can stand for (see the module docstring)."""
    backend = tokenizer.backend
    longest = max((len(token) for token in backend.get_vocab(with_added_tokens=True)), default=1)
    return max(longest, 1) * (1 if backend.normalizer is None else 4)


class LengthPolicy:
    """Applies ``prompt_too_long`` to encoded prompts and chats. Immutable."""

    def __init__(
        self, tokenizer: Tokenizer, *, max_model_len: int, policy: PolicyName, render: ChatRenderer
    ) -> None:
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._policy = policy
        self._render = render
        self.chars_per_token = chars_per_token(tokenizer)
        self.max_prompt_chars = (max_model_len + TOKEN_MARGIN) * self.chars_per_token

    def bound_text(self, text: str) -> tuple[str | None, RowError | None]:
        """The part of a text prompt to encode: all of it under `max_prompt_chars`, else the
        kept end or start of that length, or an error row for ``error``."""
        bound = self.max_prompt_chars
        if len(text) <= bound:
            return text, None
        if self._policy == "error":
            return None, self.over_bound_error()
        return (text[len(text) - bound :] if self._policy == "truncate_left" else text[:bound]), None

    def over_bound_error(self) -> RowError:
        """The ``error`` policy's row for a text or rendered chat past `max_prompt_chars`."""
        _, error = self._budget(None, None)
        assert error is not None
        return error

    def _describe(self, num_tokens: int | None) -> str:
        if num_tokens is not None:
            return f"{num_tokens} tokens"
        return (
            f"more than {self.max_prompt_chars} characters (at most {self.chars_per_token} per "
            f"token, so more than {self._max_model_len + TOKEN_MARGIN} tokens)"
        )

    def _budget(
        self, num_tokens: int | None, params: SamplingParams | None
    ) -> tuple[int | None, RowError | None]:
        """(None, None) when a prompt of `num_tokens` fits (None: past the character bound);
        else the number of tokens the policy keeps, or the error row."""
        limit = self._max_model_len - 1  # room for at least one generated token
        if num_tokens is not None and num_tokens <= limit:
            return None, None
        if self._policy == "error" or params is None:
            return None, RowError(
                "prompt_too_long",
                f"the prompt has {self._describe(num_tokens)}; max_model_len={self._max_model_len} "
                f"leaves room for {limit}",
            )
        keep = min(limit, self._max_model_len - params.max_tokens)
        if keep < 1:
            return None, RowError(
                "prompt_too_long",
                f"the prompt has {self._describe(num_tokens)} and {self._policy} keeps max_model_len - "
                f"max_tokens = {self._max_model_len} - {params.max_tokens}, which leaves no room "
                "for the prompt; lower max_tokens",
            )
        return keep, None

    def apply(self, token_ids: list[int], params: SamplingParams) -> tuple[list[int], RowError | None]:
        """Cut an encoded prompt as the policy says."""
        if not token_ids:
            return token_ids, RowError("invalid_prompt", "the prompt encodes to no tokens")
        keep, error = self._budget(len(token_ids), params)
        if keep is None:
            return token_ids, error
        if self._policy == "truncate_left":
            return token_ids[len(token_ids) - keep :], None
        return token_ids[:keep], None

    def apply_chat(
        self, token_ids: list[int] | None, messages: list[Any], params: SamplingParams
    ) -> tuple[list[int], RowError | None]:
        """Drop whole messages until the rendered chat fits (module docstring). `token_ids` is
        the whole chat's encoding, or None when its render passed `max_prompt_chars`. An error
        row when only system messages, or nothing, would remain."""
        if token_ids is not None and not token_ids:
            return token_ids, RowError("invalid_prompt", "the prompt encodes to no tokens")
        keep, error = self._budget(None if token_ids is None else len(token_ids), params)
        if keep is None:
            return token_ids or [], error
        candidates = truncation_candidates(messages, self._policy)
        fitting = _FirstFitting(self, candidates, keep).search()
        if isinstance(fitting, RowError):
            return [], fitting
        if fitting is not None:
            return fitting, None
        return [], RowError(
            "prompt_too_long",
            f"the chat has {self._describe(None if token_ids is None else len(token_ids))}; "
            f"{self._policy} drops whole messages but even one message with the system prompt "
            f"exceeds max_model_len - max_tokens = {keep}",
        )

    def encode_if_fits(self, messages: list[Any], keep: int) -> list[int] | None:
        """The ids of `messages` rendered, or None when they are more than `keep` tokens.
        Raises ChatTemplateError (not ChatTemplateTooLong) when the template fails."""
        try:
            text = self._render(messages, keep * self.chars_per_token)
        except ChatTemplateTooLong:
            return None
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        return ids if len(ids) <= keep else None


def truncation_candidates(messages: Sequence[Mapping[str, Any]], policy: PolicyName) -> list[list[Any]]:
    """The chats the policy tries, in order, each with one more message dropped: for
    truncate_left the oldest non-system message goes; for truncate_right the newest, and then
    any assistant turns left last. At least one non-system message stays."""
    num_system = 0
    while num_system < len(messages) and messages[num_system].get("role") == "system":
        num_system += 1
    system, rest = list(messages[:num_system]), list(messages[num_system:])
    if policy == "truncate_left":
        return [system + rest[start:] for start in range(1, len(rest))]
    candidates: list[list[Any]] = []
    end = len(rest)
    while end > 1:
        end -= 1
        while end > 1 and rest[end - 1].get("role") == "assistant":
            end -= 1
        candidates.append(system + rest[:end])
    return candidates


class _FirstFitting:
    """The first candidate that fits, or whose render fails, as a one-by-one scan finds it."""

    def __init__(self, policy: LengthPolicy, candidates: list[list[Any]], keep: int) -> None:
        self._policy = policy
        self._candidates = candidates
        self._keep = keep
        self._outcomes: dict[int, list[int] | ChatTemplateError | None] = {}

    def _probe(self, idx: int) -> list[int] | None:
        if idx not in self._outcomes:
            try:
                self._outcomes[idx] = self._policy.encode_if_fits(self._candidates[idx], self._keep)
            except ChatTemplateError as exc:  # e.g. a template that insists on alternation
                self._outcomes[idx] = exc
        outcome = self._outcomes[idx]
        if isinstance(outcome, ChatTemplateError):
            raise outcome
        return outcome

    def search(self) -> list[int] | RowError | None:
        """Ids of the first fitting candidate, the error row of the first failing one, or None."""
        try:
            return self._bisect()
        except ChatTemplateError:
            return self._scan()

    def _bisect(self) -> list[int] | None:
        if not self._candidates:
            return None
        found = self._probe(0)
        if found is not None:
            return found
        lo, hi = 1, len(self._candidates)  # candidates before lo do not fit; hi fits (or is the end)
        while lo < hi:
            mid = (lo + hi) // 2
            ids = self._probe(mid)
            if ids is None:
                lo = mid + 1
            else:
                hi, found = mid, ids
        return found

    def _scan(self) -> list[int] | RowError | None:
        for idx in range(len(self._candidates)):
            try:
                ids = self._probe(idx)
            except ChatTemplateError as exc:
                return RowError("chat_template_error", f"after truncation: {exc}")
            if ids is not None:
                return ids
        return None
