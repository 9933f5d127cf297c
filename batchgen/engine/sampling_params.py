"""Per-request sampling parameters, with vLLM's field names.

Immutable after construction; `__post_init__` rejects bad values with a ValueError naming the
field, so a bad request fails at submission and never inside a step.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from batchgen._checks import is_int
from batchgen.engine.structured.params import StructuredOutputsParams

__all__ = [
    "MAX_ALLOWED_TOKEN_IDS",
    "MAX_LOGIT_BIAS",
    "MAX_LOGPROBS",
    "MAX_N",
    "MAX_STOPS",
    "MAX_STOP_CHARS",
    "SamplingParams",
]

# Per-request caps, so that one row cannot build thousands of sequences or ask for a top-k
# larger than the vocabulary inside a step (OpenAI's API and vLLM's default allow 20 logprobs).
MAX_N = 128
MAX_LOGPROBS = 20
# Stop strings and stop token ids are checked at every generated token of every sample (the
# detokenizer searches the new text plus MAX_STOP_CHARS - 1 characters for each string), so a
# row may give at most MAX_STOPS of each, strings of at most MAX_STOP_CHARS characters. OpenAI
# allows 4 stop strings and vLLM sets no limit; these leave room for long vLLM-style lists.
MAX_STOPS = 64
MAX_STOP_CHARS = 512
# logit_bias entries and allowed_token_ids are turned into tensors once per sequence; the caps
# bound that work and a row's memory. OpenAI allows 300 logit_bias entries; an allowed list may
# be long (a whitelist of a vocabulary's digits and punctuation is a few thousand ids).
MAX_LOGIT_BIAS = 1024
MAX_ALLOWED_TOKEN_IDS = 1 << 17
# Penalty ranges: vLLM's and OpenAI's for presence/frequency, OpenAI's for a logit bias.
_MAX_PENALTY = 2.0
_MAX_BIAS = 100.0


def _short(value: object) -> str:
    """repr of a bad value for an error message, cut (a row's value may be megabytes)."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _is_finite_number(value: object) -> bool:
    """A number that converts to a finite float (math.isfinite raises on a too-large int)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) <= sys.float_info.max
    return isinstance(value, float) and math.isfinite(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens for one prompt (vLLM's fields and semantics).

    temperature 0 is greedy; top_k -1 (or 0) disables top-k; top_p 1 and min_p 0 disable theirs.
    `seed` makes a request's samples reproducible whatever else shares the batch; `n` samples
    share the prompt's KV blocks (at most MAX_N = 128). `logprobs` asks for that many top
    log-probabilities per generated token (the sampled token's is always included; at most
    MAX_LOGPROBS = 20, and the engine refuses more than the vocabulary). `top_k` keeps exactly
    k tokens, ties going to the lower token ids. Log-probabilities are those of the model's raw
    logits (vLLM's default `raw_logprobs`), before any of the processors below.

    Logits processors, applied in this order (`batchgen.engine.sampler`):
    `allowed_token_ids` (only these may be drawn) and `bad_words` (strings, tokenized with and
    without a leading space as vLLM does; a word of several tokens is banned at its last token
    when the generated tokens end with the rest), `logit_bias` ({token id: bias in [-100, 100]}
    added to the logits), `min_tokens` (EOS and `stop_token_ids` masked until that many tokens
    were generated; stop strings are not matched before either), `presence_penalty` and
    `frequency_penalty` (OpenAI's: each logit minus `frequency * count + presence * (count >
    0)` over the generated tokens; in [-2, 2]) and `repetition_penalty` (over prompt and
    generated tokens, as transformers applies it: a positive logit divided by it, a negative one
    multiplied; > 0, 1 is off), then temperature and the top-k/top-p/min-p filters.

    `prompt_logprobs`: that many top log-probabilities for every prompt token (the prompt
    token's own always included; None for the first token, like vLLM); such a request computes
    its whole prompt (cached prompt tokens have no logits). `skip_special_tokens`: leave special
    tokens out of the output text. `include_stop_str_in_output`: keep a matched stop string at
    the end of the text.

    `structured_outputs`: the output must match a JSON schema, a regex, one of a list of strings,
    a grammar, or be any JSON object (`StructuredOutputsParams`, or a dict with one of its keys:
    json, regex, choice, grammar, json_object). Its grammar mask runs after the penalties and
    before temperature; EOS is allowed only where the grammar accepts, and the row finishes as
    soon as its grammar is complete (finish_reason "stop"), or at max_tokens ("length").
    """

    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: Sequence[str] = ()
    stop_token_ids: Sequence[int] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    logit_bias: Mapping[int, float] | None = None
    allowed_token_ids: Sequence[int] | None = None
    bad_words: Sequence[str] | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        if not is_int(self.n) or not 1 <= self.n <= MAX_N:
            raise ValueError(f"SamplingParams.n must be an integer in [1, {MAX_N}], got {self.n!r}")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_finite_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0, got {_short(self.temperature)}")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if not is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off) or an integer >= 0, got {self.top_k!r}")
        if not _is_number(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"SamplingParams.min_p must be in [0, 1], got {self.min_p!r}")
        if self.seed is not None and (not is_int(self.seed) or not -(2**63) <= self.seed < 2**63):
            # The output row's `seed` column is int64: a larger seed could not be written.
            raise ValueError(
                f"SamplingParams.seed must be a 64-bit integer (in [-2**63, 2**63)) or None, got {self.seed!r}"
            )
        self._validate_stops()
        if not isinstance(self.stop_token_ids, list | tuple) or not all(
            is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(
                f"SamplingParams.stop_token_ids must be a list of integers >= 0, got {self.stop_token_ids!r}"
            )
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"SamplingParams.ignore_eos must be a boolean, got {self.ignore_eos!r}")
        if self.logprobs is not None and (not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(
                f"SamplingParams.logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, got {self.logprobs!r}"
            )
        if self.prompt_logprobs is not None and (
            not is_int(self.prompt_logprobs) or not 0 <= self.prompt_logprobs <= MAX_LOGPROBS
        ):
            raise ValueError(
                f"SamplingParams.prompt_logprobs must be an integer in [0, {MAX_LOGPROBS}] or None, "
                f"got {_short(self.prompt_logprobs)}"
            )
        for name in ("skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SamplingParams.{name} must be a boolean, got {_short(getattr(self, name))}")
        self._validate_processors()
        try:
            StructuredOutputsParams.coerce(self.structured_outputs)
        except ValueError as exc:
            raise ValueError(f"SamplingParams.structured_outputs: {exc}") from exc

    @property
    def structured(self) -> StructuredOutputsParams | None:
        """`structured_outputs` as a StructuredOutputsParams (a dict is converted)."""
        return StructuredOutputsParams.coerce(self.structured_outputs)

    def _validate_processors(self) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_finite_number(value) or not -_MAX_PENALTY <= value <= _MAX_PENALTY:
                raise ValueError(f"SamplingParams.{name} must be a number in [-2, 2], got {_short(value)}")
        if not _is_finite_number(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise ValueError(
                f"SamplingParams.repetition_penalty must be a finite number > 0 (1 is off), "
                f"got {_short(self.repetition_penalty)}"
            )
        if not is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"SamplingParams.min_tokens must be an integer in [0, max_tokens={self.max_tokens}], "
                f"got {_short(self.min_tokens)}"
            )
        self._validate_logit_bias()
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not isinstance(allowed, list | tuple) or not allowed or len(allowed) > MAX_ALLOWED_TOKEN_IDS:
                raise ValueError(
                    "SamplingParams.allowed_token_ids must be a non-empty list of at most "
                    f"{MAX_ALLOWED_TOKEN_IDS} token ids, or None, got {_short(allowed)}"
                )
            if not all(is_int(t) and t >= 0 for t in allowed):
                raise ValueError(
                    f"SamplingParams.allowed_token_ids must hold integers >= 0, got {_short(allowed)}"
                )
        words = self.bad_words
        if words is not None:
            if not isinstance(words, list | tuple) or len(words) > MAX_STOPS:
                raise ValueError(
                    f"SamplingParams.bad_words must be a list of at most {MAX_STOPS} strings, or None, "
                    f"got {_short(words)}"
                )
            if not all(isinstance(w, str) and w.strip() and len(w) <= MAX_STOP_CHARS for w in words):
                raise ValueError(
                    "SamplingParams.bad_words must hold non-blank strings of at most "
                    f"{MAX_STOP_CHARS} characters, got {_short(words)}"
                )

    def _validate_logit_bias(self) -> None:
        bias = self.logit_bias
        if bias is None:
            return
        if not isinstance(bias, Mapping) or len(bias) > MAX_LOGIT_BIAS:
            raise ValueError(
                f"SamplingParams.logit_bias must be a mapping of at most {MAX_LOGIT_BIAS} "
                f"{{token id: bias}} entries, or None, got {_short(bias)}"
            )
        for token, value in bias.items():
            if not is_int(token) or token < 0:
                raise ValueError(f"SamplingParams.logit_bias keys must be token ids (integers >= 0), got {_short(token)}")
            if not _is_finite_number(value) or not -_MAX_BIAS <= value <= _MAX_BIAS:
                raise ValueError(
                    f"SamplingParams.logit_bias[{token}] must be a number in [-100, 100], got {_short(value)}"
                )

    def check_vocab(self, vocab_size: int) -> None:
        """Raises ValueError naming the field when a token id of allowed_token_ids or a
        logit_bias key is outside the vocabulary [0, vocab_size). (A stop token id outside it
        is harmless: it is never drawn.)"""
        for name, ids in (
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("logit_bias", tuple(self.logit_bias or ())),
        ):
            bad = next((t for t in ids if t >= vocab_size), None)
            if bad is not None:
                raise ValueError(
                    f"SamplingParams.{name}: token id {bad} is outside the vocabulary [0, {vocab_size})"
                )

    def _validate_stops(self) -> None:
        for name, values in (("stop", self.stop), ("stop_token_ids", self.stop_token_ids)):
            if isinstance(values, list | tuple) and len(values) > MAX_STOPS:
                raise ValueError(f"SamplingParams.{name} may hold at most {MAX_STOPS} entries, got {len(values)}")
        if not all(isinstance(s, str) and s for s in self.stop_strings):
            raise ValueError(f"SamplingParams.stop must be a list of non-empty strings, got {_short(self.stop)}")
        longest = max((len(s) for s in self.stop_strings), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(
                f"SamplingParams.stop strings may be at most {MAX_STOP_CHARS} characters long, got one of {longest}"
            )

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """`stop` as a tuple (a single string is one stop string)."""
        if isinstance(self.stop, str):
            return (self.stop,)
        if not isinstance(self.stop, list | tuple):
            raise ValueError(f"SamplingParams.stop must be a list of strings, got {_short(self.stop)}")
        return tuple(self.stop)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0

    @property
    def has_penalties(self) -> bool:
        """Presence, frequency or repetition penalty on (they need the sequence's token counts)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def has_logits_processors(self) -> bool:
        """Any processor that changes logits before temperature (see the class docstring)."""
        return (
            self.has_penalties
            or self.min_tokens > 0
            or bool(self.logit_bias)
            or self.allowed_token_ids is not None
            or bool(self.bad_words)
            or self.structured_outputs is not None
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SamplingParams:
        """Build from a dict (a job file, a per-row struct); unknown keys raise ValueError."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"unknown sampling parameter(s) {', '.join(unknown)}; expected some of {', '.join(sorted(known))}"
            )
        given = {k: v for k, v in values.items() if v is not None or k == "seed"}
        if "structured_outputs" in given:
            try:
                given["structured_outputs"] = StructuredOutputsParams.coerce(given["structured_outputs"])
            except ValueError as exc:
                raise ValueError(f"SamplingParams.structured_outputs: {exc}") from exc
        return cls(**given)

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def with_seed(self, seed: int | None) -> SamplingParams:
        """A copy with `seed` changed; only the seed is validated again (the rest was when this
        one was made). A job gives each row its own seed: this is `replace(seed=...)` at a few
        microseconds instead of a whole validation."""
        if seed is not None and (not is_int(seed) or not -(2**63) <= seed < 2**63):
            raise ValueError(f"SamplingParams.seed must be a 64-bit integer (in [-2**63, 2**63)) or None, got {seed!r}")
        copy = object.__new__(SamplingParams)
        for name in _FIELD_NAMES:
            object.__setattr__(copy, name, getattr(self, name))
        object.__setattr__(copy, "seed", seed)
        return copy


_FIELD_NAMES = tuple(f.name for f in fields(SamplingParams))
