"""Prepare stage: input rows -> tokenized requests or per-row errors.

A row never kills the job: a null, empty or non-string prompt, malformed messages, token ids
outside the vocabulary, a chat template failure, a problem the reader found (invalid UTF-8, a
malformed JSONL line), invalid per-row sampling parameters, a duplicate id or a prompt too long for the
context become a `PreparedRow` with an `error` (code and message), and the job goes on.
Pure over Python values and a tokenizer; no torch, no Parquet.

Length policy (``prompt_too_long``): see `batchgen.job.length_policy`, which also bounds the
work a long prompt costs (a text prompt past max_model_len's character bound is cut before it is
encoded, a chat's render stops at it) and searches chat truncations in O(log n) renders. A chat
template that fails or passes its sandbox's limits (`batchgen.tokenizer.chat_template`) is a
``chat_template_error`` row.

Chat templates see ``strftime_now`` at the job's pinned time (`RowPreparer` ``now``), so a
resumed job renders the same prompts on another day, and render under the job's chat options
(`batchgen.tokenizer.chat_options`: an override template, template kwargs, the generation prompt
or continuing the final message).

Scoring rows (``task: score``, `batchgen.job.score_rows`): each row's prompt (text, chat or
token ids) and completion (text, encoded without special tokens) become one request whose
`score_from` is the prompt's length; a completion that is a chat is split into the messages the
template renders and the reply scored. An OpenAI ``echo`` row keeps its prompt text to echo;
one with max_tokens 0 (``prompt_only``) is a score row of its prompt from token 1.

Ids: a repeated id within a shard is an error row (``duplicate_id``); an id already seen in
another shard of the run is kept (it is a valid row) and counted in
`RowPreparer.num_duplicate_ids_across_shards`, from a set of 64-bit id hashes capped at
`MAX_TRACKED_IDS` entries (`num_ids_tracked` says how many were checked).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import xxhash

from batchgen.engine.sampling_params import SamplingParams
from batchgen.engine.seeding import derive_seed
from batchgen.job.length_policy import LengthPolicy, PolicyName
from batchgen.job.row_error import RowError
from batchgen.job.score_rows import SCORE_PARAMS, fit_score, split_chat_completion
from batchgen.job.structured_rows import sampling_params_error
from batchgen.tokenizer.chat_options import ChatOptions, render_chat
from batchgen.tokenizer.chat_template import (
    ChatTemplateError,
    ChatTemplateTooLong,
    validate_messages,
)
from batchgen.tokenizer.tokenizer import Tokenizer

__all__ = ["MAX_TRACKED_IDS", "IdState", "PreparedRow", "RowError", "RowPreparer", "id_hash", "row_seed"]

MAX_TRACKED_IDS = 4_000_000  # ~70 bytes each in a Python set: a few hundred MB at most


@dataclass(frozen=True, slots=True)
class PreparedRow:
    """One input row, ready for the engine (token_ids and params set) or failed (error set).

    shard/row_idx locate it for reassembly; seed is the row's base seed (sample i uses
    derive_seed(seed, i)); num_samples is the number of output rows it yields. score_from: a
    score row's first scored token (`LLMEngine.add_request(score_from=...)`); echo_text: the
    prompt an OpenAI ``echo`` response repeats.
    """

    shard: int
    row_idx: int
    id: int | str | None
    passthrough: tuple[Any, ...]
    token_ids: tuple[int, ...] | None
    params: SamplingParams | None
    seed: int
    num_samples: int
    error: RowError | None = None
    score_from: int | None = None
    echo_text: str | None = None


def id_hash(row_id: int | str) -> int:
    """A 64-bit hash of a row id; an integer and its decimal string hash differently."""
    tag = b"i" if isinstance(row_id, int) else b"s"
    return xxhash.xxh64_intdigest(tag + str(row_id).encode("utf-8"))


def row_seed(job_seed: int, row_id: int | str) -> int:
    """The base seed of a row, from the job seed and the row id (stable across runs)."""
    key = row_id if isinstance(row_id, int) else xxhash.xxh64_intdigest(row_id.encode("utf-8"))
    return derive_seed(job_seed, key)


@dataclass(frozen=True, slots=True)
class IdState:
    """A preparer's id sets (`RowPreparer.id_state`): the ids seen in each shard not yet
    forgotten, the run's id hashes, and the duplicates counted across shards."""

    seen_ids: dict[int, set[int | str]]
    job_id_hashes: set[int]
    num_duplicate_ids_across_shards: int


@dataclass(frozen=True, slots=True)
class _ScorePending:
    """A score row waiting to be encoded: the prompt as text (a chat rendered, or plain text) or
    as token ids, and the completion text."""

    position: int
    text: str | None
    is_chat: bool
    prompt_ids: list[int] | None
    completion: str


class RowPreparer:
    """Turns column values into PreparedRows. Holds the per-shard set of ids seen and the
    run's set of id hashes (see the module docstring). `now` is the time chat templates see."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        sampling: SamplingParams,
        *,
        max_model_len: int,
        prompt_too_long: PolicyName,
        job_seed: int,
        now: datetime,
        vocab_size: int | None = None,
        chat: ChatOptions | None = None,
    ) -> None:
        """`vocab_size` bounds token-id prompts (default: the tokenizer's vocabulary); `chat`
        says how chats render (default `ChatOptions()`: the tokenizer's template with the
        generation prompt)."""
        self._tokenizer = tokenizer
        self._chat = ChatOptions() if chat is None else chat
        self._vocab_size = tokenizer.vocab_size if vocab_size is None else vocab_size
        self._sampling = sampling
        self._policy = prompt_too_long
        self._length = LengthPolicy(
            tokenizer, max_model_len=max_model_len, policy=prompt_too_long, render=self._chat_text
        )
        self._job_seed = job_seed
        self._max_model_len = max_model_len
        self._now = now
        self._seen_ids: dict[int, set[int | str]] = {}
        self._job_id_hashes: set[int] = set()
        self.num_duplicate_ids_across_shards = 0

    @property
    def num_ids_tracked(self) -> int:
        """Distinct id hashes checked for duplicates across shards (at most MAX_TRACKED_IDS)."""
        return len(self._job_id_hashes)

    def forget_shard(self, shard: int) -> None:
        self._seen_ids.pop(shard, None)

    def id_state(self) -> IdState:
        """The id sets as they are now (shared, not copied: for handing to another process)."""
        return IdState(self._seen_ids, self._job_id_hashes, self.num_duplicate_ids_across_shards)

    def restore_id_state(self, state: IdState) -> None:
        """Take over `state`'s id sets (a copy of this preparer that prepared rows elsewhere)."""
        self._seen_ids = state.seen_ids
        self._job_id_hashes = state.job_id_hashes
        self.num_duplicate_ids_across_shards = state.num_duplicate_ids_across_shards

    def prepare(
        self,
        shard: int,
        first_row_idx: int,
        ids: Sequence[Any],
        prompts: Sequence[Any] | None,
        messages: Sequence[Any] | None,
        sampling: Sequence[Any] | None,
        passthrough: Sequence[tuple[Any, ...]],
        *,
        token_ids: Sequence[Any] | None = None,
        row_errors: Sequence[RowError | None] | None = None,
        completions: Sequence[Any] | None = None,
        echo: Sequence[Any] | None = None,
    ) -> list[PreparedRow]:
        """Prepare a batch of rows (column values as Python lists, all the same length).

        Each row uses `messages` (a chat), else `token_ids` (already tokenized), else
        `prompts`; when both `messages` and `prompts` are given (OpenAI batch files mix chat
        and completion requests), a row with null messages uses its prompt. A row with a
        `row_errors` entry (found by the reader: bad JSON, invalid UTF-8, ...) is an error row.
        With `completions` the rows are scores (module docstring); `echo` holds an OpenAI echo
        mode per row (None, "echo" or "prompt_only").
        """
        if completions is not None:
            return self._prepare_scores(
                shard, first_row_idx, ids, prompts, messages, token_ids, completions, passthrough, row_errors
            )
        seen = self._seen_ids.setdefault(shard, set())
        rows: list[PreparedRow] = []
        texts: list[str | None] = []  # None: a chat rendered past the length bound
        chats: list[bool] = []
        pending: list[tuple[int, SamplingParams]] = []  # (position in batch, params) of texts
        for i, raw_id in enumerate(ids):
            row_idx = first_row_idx + i
            row_id, error = self._check_id(raw_id, seen)
            if row_errors is not None and row_errors[i] is not None:
                error = row_errors[i]
            params, params_error = self._params(sampling[i] if sampling is not None else None)
            error = error or params_error
            mode = echo[i] if echo is not None else None
            if mode == "prompt_only" and params is not None:
                params = SCORE_PARAMS.replace(prompt_logprobs=params.prompt_logprobs)
            effective = params or self._sampling
            key = "" if row_id is None else row_id
            seed = effective.seed if effective.seed is not None else row_seed(self._job_seed, key)
            text: str | None = None
            prompt_ids: tuple[int, ...] | None = None
            is_chat = messages is not None and (prompts is None or messages[i] is not None)
            if error is None and params is not None:
                if is_chat:
                    assert messages is not None
                    text, error = self._render(messages[i])
                elif token_ids is not None:
                    ids_, error = self._token_ids(token_ids[i])
                    if error is None:
                        ids_, error = self._length.apply(ids_, params)
                        prompt_ids = tuple(ids_) if error is None else None
                else:
                    text, error = self._prompt(prompts[i] if prompts else None)
                    if text is not None:
                        text, error = self._length.bound_text(text)
            rows.append(
                PreparedRow(
                    shard=shard,
                    row_idx=row_idx,
                    id=row_id,
                    passthrough=passthrough[i],
                    token_ids=prompt_ids,
                    params=params,
                    seed=seed,
                    num_samples=effective.n,
                    error=error,
                    score_from=1 if mode == "prompt_only" else None,
                    echo_text=prompts[i] if mode is not None and prompts is not None else None,
                )
            )
            if error is None and (text is not None or is_chat) and params is not None:
                texts.append(text)
                chats.append(is_chat)
                pending.append((i, params))
        # Chat prompts carry their special tokens in the template; plain prompts get the
        # tokenizer's (BOS); each kind is encoded in one call.
        for chat in (False, True):
            group = [k for k, c in enumerate(chats) if c == chat]
            if not group:
                continue
            encoded = iter(
                self._tokenizer.encode_batch(
                    [t for k in group if (t := texts[k]) is not None], add_special_tokens=not chat
                )
            )
            for k in group:
                i, params = pending[k]
                encoded_ids = None if texts[k] is None else list(next(encoded))
                if chat and messages is not None:
                    ids_, error = self._length.apply_chat(encoded_ids, list(messages[i]), params)
                else:
                    assert encoded_ids is not None
                    ids_, error = self._length.apply(encoded_ids, params)
                rows[i] = dataclasses.replace(
                    rows[i], token_ids=tuple(ids_) if error is None else None, params=params, error=error
                )
        return rows

    def _prepare_scores(
        self,
        shard: int,
        first_row_idx: int,
        ids: Sequence[Any],
        prompts: Sequence[Any] | None,
        messages: Sequence[Any] | None,
        token_ids: Sequence[Any] | None,
        completions: Sequence[Any],
        passthrough: Sequence[tuple[Any, ...]],
        row_errors: Sequence[RowError | None] | None,
    ) -> list[PreparedRow]:
        """Score rows: each pair's tokens with `score_from` at the completion (module docstring)."""
        seen = self._seen_ids.setdefault(shard, set())
        rows: list[PreparedRow] = []
        pending: list[_ScorePending] = []
        for i, raw_id in enumerate(ids):
            row_id, error = self._check_id(raw_id, seen)
            if row_errors is not None and row_errors[i] is not None:
                error = row_errors[i]
            found: _ScorePending | RowError | None = None
            if error is None:
                found = self._score_inputs(i, prompts, messages, token_ids, completions[i])
                if isinstance(found, RowError):
                    error = found
            rows.append(
                PreparedRow(
                    shard=shard,
                    row_idx=first_row_idx + i,
                    id=row_id,
                    passthrough=passthrough[i],
                    token_ids=None,
                    params=SCORE_PARAMS,
                    seed=row_seed(self._job_seed, "" if row_id is None else row_id),
                    num_samples=1,
                    error=error,
                )
            )
            if isinstance(found, _ScorePending):
                pending.append(found)
        if not pending:
            return rows
        encode = self._tokenizer.encode_batch
        plain = iter(encode([p.text or "" for p in pending if not p.is_chat and p.prompt_ids is None]))
        chats = iter(encode([p.text or "" for p in pending if p.is_chat], add_special_tokens=False))
        completion_ids = encode([p.completion for p in pending], add_special_tokens=False)
        for p, c_ids in zip(pending, completion_ids, strict=True):
            if p.prompt_ids is not None:
                p_ids = p.prompt_ids
            else:
                p_ids = list(next(chats) if p.is_chat else next(plain))
            p_ids, c_ids, error = fit_score(p_ids, list(c_ids), max_model_len=self._max_model_len, policy=self._policy)
            rows[p.position] = dataclasses.replace(
                rows[p.position],
                token_ids=None if error is not None else tuple(p_ids + c_ids),
                score_from=len(p_ids),
                error=error,
            )
        return rows

    def _score_inputs(
        self,
        i: int,
        prompts: Sequence[Any] | None,
        messages: Sequence[Any] | None,
        token_ids: Sequence[Any] | None,
        value: Any,
    ) -> _ScorePending | RowError:
        """A score row's prompt (text to encode, or token ids) and completion text, or its error."""
        has_prompt = prompts is not None or messages is not None or token_ids is not None
        bound = self._length.max_prompt_chars
        if isinstance(value, str):
            if not value:
                return RowError("invalid_completion", "the completion is empty")
            if len(value) > bound:
                return self._length.over_bound_error()
            if not has_prompt:
                return RowError(
                    "invalid_completion", "a text completion needs a prompt (columns.prompt, messages or prompt_token_ids)"
                )
            if token_ids is not None:
                ids_, error = self._token_ids(token_ids[i])
                return error or _ScorePending(i, None, False, ids_, value)
            if messages is not None:
                text, error = self._render(messages[i])
            else:
                text, error = self._prompt(prompts[i] if prompts is not None else None)
                if text is not None:
                    text, error = self._length.bound_text(text)
            if error is not None:
                return error
            if text is None:  # a chat rendered past the length bound
                return self._length.over_bound_error()
            return _ScorePending(i, text, messages is not None, None, value)
        if isinstance(value, list | tuple):
            if has_prompt:
                return RowError(
                    "invalid_completion",
                    "a chat completion holds its own prompt; leave columns.prompt, messages and prompt_token_ids unset",
                )
            split = split_chat_completion(value)
            if isinstance(split, RowError):
                return split
            if len(split.completion) > bound:
                return self._length.over_bound_error()
            text, error = self._render(split.prompt_messages)
            if error is not None:
                return error
            if text is None:
                return self._length.over_bound_error()
            return _ScorePending(i, text, True, None, split.completion)
        kind = "null" if value is None else type(value).__name__
        return RowError("invalid_completion", f"the completion must be text or a chat, got {kind}")

    # --------------------------------------------------------------- checks
    def _check_id(
        self, raw_id: Any, seen: set[int | str]
    ) -> tuple[int | str | None, RowError | None]:
        if raw_id is None:
            # Null in the output too: the id column keeps the input's type (an integer column
            # cannot hold "").
            return None, RowError("invalid_id", "the id is null")
        row_id: int | str = raw_id if isinstance(raw_id, int | str) else str(raw_id)
        if row_id in seen:
            return row_id, RowError("duplicate_id", f"id {row_id!r} appears more than once in this shard")
        seen.add(row_id)
        key = id_hash(row_id)
        if key in self._job_id_hashes:
            self.num_duplicate_ids_across_shards += 1
        elif len(self._job_id_hashes) < MAX_TRACKED_IDS:
            self._job_id_hashes.add(key)
        return row_id, None

    def _params(self, value: Any) -> tuple[SamplingParams | None, RowError | None]:
        if value is None:
            return self._sampling, None
        if not isinstance(value, Mapping):
            return None, RowError("invalid_sampling_params", f"expected a struct, got {type(value).__name__}")
        changes = {k: _plain_value(k, v) for k, v in value.items() if not _is_missing(v) and not _is_unset_struct(k, v)}
        if not changes:
            return self._sampling, None
        try:
            merged = {**_as_dict(self._sampling), **changes}
            return SamplingParams.from_mapping(merged), None
        except (ValueError, TypeError) as exc:
            return None, sampling_params_error(str(exc))

    def _token_ids(self, value: Any) -> tuple[list[int], RowError | None]:
        if value is None:
            return [], RowError("invalid_prompt", "the prompt token ids are null")
        if not isinstance(value, list | tuple) or not value:
            return [], RowError("invalid_prompt", "the prompt token ids are empty")
        vocab_size = self._vocab_size
        for token in value:
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                return [], RowError(
                    "invalid_prompt",
                    f"prompt token id {token!r} is outside the vocabulary [0, {vocab_size})",
                )
        return list(value), None

    @staticmethod
    def _prompt(value: Any) -> tuple[str | None, RowError | None]:
        if value is None:
            return None, RowError("invalid_prompt", "the prompt is null")
        if not isinstance(value, str):
            return None, RowError("invalid_prompt", f"the prompt must be a string, got {type(value).__name__}")
        if not value.strip():
            return None, RowError("invalid_prompt", "the prompt is empty")
        return value, None

    def _render(self, value: Any) -> tuple[str | None, RowError | None]:
        """The chat's prompt text; None (without an error) when it renders past the length
        bound and the policy truncates."""
        if value is None:
            return None, RowError("invalid_messages", "the messages are null")
        if not isinstance(value, list | tuple) or not value:
            return None, RowError("invalid_messages", "the messages must be a non-empty list of {role, content}")
        try:
            validate_messages(list(value))
        except ChatTemplateError as exc:
            return None, RowError("invalid_messages", str(exc))
        try:
            return self._chat_text(list(value), self._length.max_prompt_chars), None
        except ChatTemplateTooLong:
            if self._policy == "error":
                return None, self._length.over_bound_error()
            return None, None
        except ChatTemplateError as exc:
            return None, RowError("chat_template_error", str(exc))

    def _chat_text(self, messages: list[Any], max_output_chars: int) -> str:
        """The prompt text of `messages` under the job's chat options, at the pinned time;
        raises ChatTemplateTooLong past `max_output_chars` characters."""
        tok = self._tokenizer
        return render_chat(
            messages,
            self._chat,
            default_template=tok.chat_template,
            bos_token=tok.bos_token,
            eos_token=tok.eos_token,
            max_output_chars=max_output_chars,
            strftime_now=self._now.strftime,
        )


# SamplingParams fields that hold integers: pandas writes them as floats when a column has
# missing values (1.0, NaN), so a whole-number float counts as the integer.
_INT_FIELDS = frozenset({"n", "max_tokens", "top_k", "seed", "logprobs", "min_tokens", "prompt_logprobs"})


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_unset_struct(name: str, value: Any) -> bool:
    """A per-row structured_outputs struct with no kind set (every field null, json_object
    false): the row keeps the job's setting, like a null struct."""
    return name == "structured_outputs" and isinstance(value, Mapping) and all(v is None or v is False for v in value.values())


def _plain_value(name: str, value: Any) -> Any:
    if name in _INT_FIELDS and isinstance(value, float) and value.is_integer():
        return int(value)
    if name in ("stop_token_ids", "allowed_token_ids") and isinstance(value, list | tuple):
        return tuple(int(v) if isinstance(v, float) and v.is_integer() else v for v in value)
    if name == "bad_words" and isinstance(value, list):
        return tuple(value)
    # An Arrow map<int, float> column reads as [(token id, bias), ...]; another shape is left
    # for SamplingParams to refuse, naming the field.
    if name == "logit_bias" and isinstance(value, list | tuple) and all(
        isinstance(pair, tuple) and len(pair) == 2 for pair in value
    ):
        return {_plain_value("n", k): v for k, v in value}
    if name == "stop" and isinstance(value, list):
        return tuple(value)
    return value


def _as_dict(params: SamplingParams) -> dict[str, Any]:
    return {name: getattr(params, name) for name in params.__dataclass_fields__}
