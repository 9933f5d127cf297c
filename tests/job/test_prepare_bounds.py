"""The prepare stage on unbounded input (issue 20, defect 9): prompts are cut by the length
policy's character bound before they are encoded, chat truncation takes O(log n) renders and
returns what the one-by-one scan returned, hostile chat templates are error rows."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.sampling_params import SamplingParams
from batchgen.job.length_policy import TOKEN_MARGIN, chars_per_token
from batchgen.job.prepare import PreparedRow, RowError, RowPreparer
from batchgen.tokenizer.chat_template import ChatTemplateError, render_chat_template
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import smollm2_tokenizer

NOW = datetime(2026, 3, 4, 5, 6, 7)

# Roles must alternate user/assistant after an optional system message (as Mistral's and
# Llama 2's templates insist), so that dropping one message can make the template raise.
ALTERNATING = (
    "{% if messages[0].role == 'system' %}{% set rest = messages[1:] %}[sys]{{ messages[0].content }}"
    "{% else %}{% set rest = messages %}{% endif %}{% for m in rest %}"
    "{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('roles must alternate') }}{% endif %}"
    "[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


class SpyTokenizer(Tokenizer):
    """The SmolLM2 tokenizer, recording the length of every text it encodes."""

    __slots__ = ("encoded",)

    def __init__(self, chat_template: str | None = None) -> None:
        base = smollm2_tokenizer()
        super().__init__(
            base.backend,
            bos_token=base.bos_token,
            eos_token=base.eos_token,
            chat_template=base.chat_template if chat_template is None else chat_template,
        )
        self.encoded: list[int] = []

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        self.encoded.append(len(text))
        return super().encode(text, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True) -> list[list[int]]:
        self.encoded.extend(len(t) for t in texts)
        return super().encode_batch(texts, add_special_tokens=add_special_tokens)


def preparer(tokenizer: Tokenizer, policy: str, *, max_model_len: int, max_tokens: int = 8) -> RowPreparer:
    return RowPreparer(
        tokenizer,
        SamplingParams(max_tokens=max_tokens),
        max_model_len=max_model_len,
        prompt_too_long=policy,  # type: ignore[arg-type]
        job_seed=0,
        now=NOW,
    )


@functools.lru_cache(maxsize=256)
def smollm2_preparer(policy: str, max_model_len: int, max_tokens: int) -> RowPreparer:
    return preparer(smollm2_tokenizer(), policy, max_model_len=max_model_len, max_tokens=max_tokens)


def prepare_prompt(p: RowPreparer, prompt: str) -> PreparedRow:
    (row,) = p.prepare(0, 0, [0], [prompt], None, None, [()])
    p.forget_shard(0)
    return row


def prepare_chat(p: RowPreparer, chat: list[dict[str, Any]]) -> PreparedRow:
    (row,) = p.prepare(0, 0, [0], None, [chat], None, [()])
    p.forget_shard(0)
    return row


def bound(max_model_len: int) -> int:
    return (max_model_len + TOKEN_MARGIN) * chars_per_token(smollm2_tokenizer())


def test_the_bound_comes_from_the_longest_token() -> None:
    # SmolLM2's longest token is 81 characters ("Ċ" + 80 x "Ġ"); it has no normalizer
    assert chars_per_token(smollm2_tokenizer()) == 81


# ------------------------------------------------------------------------------------ prompts

HUGE_PROMPT = "lorem ipsum dolor " * 1_200_000  # 21.6 M characters


@pytest.mark.parametrize("policy", ["truncate_left", "truncate_right"])
def test_a_huge_prompt_is_cut_before_it_is_encoded(policy: str) -> None:
    tok = SpyTokenizer()
    row = prepare_prompt(preparer(tok, policy, max_model_len=2048), HUGE_PROMPT)
    assert tok.encoded == [bound(2048)]  # not 21.6 M characters
    assert row.error is None and row.token_ids is not None and len(row.token_ids) == 2048 - 8
    words = smollm2_tokenizer().encode("lorem ipsum dolor " * 4000)  # what a full encode keeps
    expected = words[-(2048 - 8) :] if policy == "truncate_left" else words[: 2048 - 8]
    assert list(row.token_ids) == expected


def test_a_huge_prompt_is_an_error_row_without_encoding_under_the_error_policy() -> None:
    tok = SpyTokenizer()
    row = prepare_prompt(preparer(tok, "error", max_model_len=2048), HUGE_PROMPT)
    assert tok.encoded == []
    assert row.error == RowError(
        "prompt_too_long",
        f"the prompt has more than {bound(2048)} characters (at most 81 per token, so more than "
        f"{2048 + TOKEN_MARGIN} tokens); max_model_len=2048 leaves room for 2047",
    )


_words = st.lists(st.sampled_from(["a", "bb", "hello", " ", "\n", "🙂", "x1", "<|im_start|>", "éé"]), max_size=400)
num_prompt_examples = [0]


@settings(max_examples=60)
@given(_words, st.integers(min_value=2, max_value=60), st.integers(min_value=1, max_value=70))
def test_prompts_under_the_bound_truncate_exactly_as_a_full_encode(
    words: list[str], max_model_len: int, max_tokens: int
) -> None:
    num_prompt_examples[0] += 1
    prompt = "".join(words) + "end"
    assert len(prompt) <= bound(max_model_len)
    full = smollm2_tokenizer().encode(prompt)
    keep = min(max_model_len - 1, max_model_len - max_tokens)
    for policy in ("truncate_left", "truncate_right"):
        row = prepare_prompt(smollm2_preparer(policy, max_model_len, max_tokens), prompt)
        if len(full) <= max_model_len - 1:
            assert row.error is None and list(row.token_ids or ()) == full
        elif keep < 1:
            assert row.error is not None and row.error.code == "prompt_too_long"
        else:
            assert row.error is None
            assert list(row.token_ids or ()) == (full[-keep:] if policy == "truncate_left" else full[:keep])


# -------------------------------------------------------------------------------------- chats


def naive_chat(
    tok: Tokenizer, messages: list[dict[str, Any]], *, max_model_len: int, policy: str, max_tokens: int
) -> tuple[tuple[int, ...] | None, RowError | None]:
    """The prepare stage before this change: the whole chat encoded, then one message dropped
    at a time, each candidate rendered and encoded whole."""
    assert tok.chat_template is not None

    def encode(chat: list[dict[str, Any]]) -> list[int]:
        text = render_chat_template(
            tok.chat_template or "", chat, add_generation_prompt=True, bos_token=tok.bos_token,
            eos_token=tok.eos_token, strftime_now=NOW.strftime,
        )
        return tok.encode(text, add_special_tokens=False)

    try:
        token_ids = encode(messages)
    except ChatTemplateError as exc:
        return None, RowError("chat_template_error", str(exc))
    limit = max_model_len - 1
    if len(token_ids) <= limit:
        return tuple(token_ids), None
    if policy == "error":
        return None, RowError(
            "prompt_too_long", f"the prompt has {len(token_ids)} tokens; max_model_len={max_model_len} leaves room for {limit}"
        )
    keep = min(limit, max_model_len - max_tokens)
    if keep < 1:
        return None, RowError(
            "prompt_too_long",
            f"the prompt has {len(token_ids)} tokens and {policy} keeps max_model_len - max_tokens = "
            f"{max_model_len} - {max_tokens}, which leaves no room for the prompt; lower max_tokens",
        )
    num_system = 0
    while num_system < len(messages) and messages[num_system].get("role") == "system":
        num_system += 1
    system, rest = messages[:num_system], messages[num_system:]
    while len(rest) > 1:
        if policy == "truncate_left":
            rest = rest[1:]
        else:
            rest = rest[:-1]
            while len(rest) > 1 and rest[-1].get("role") == "assistant":
                rest = rest[:-1]
        try:
            ids = encode(system + rest)
        except ChatTemplateError as exc:
            return None, RowError("chat_template_error", f"after truncation: {exc}")
        if len(ids) <= keep:
            return tuple(ids), None
    return None, RowError(
        "prompt_too_long",
        f"the chat has {len(token_ids)} tokens; {policy} drops whole messages but even one message "
        f"with the system prompt exceeds max_model_len - max_tokens = {keep}",
    )


_message = st.builds(
    lambda role, n, seed: {"role": role, "content": " ".join(f"w{(seed + k) % 97}" for k in range(n))},
    st.sampled_from(["user", "assistant"]),
    st.integers(min_value=0, max_value=25),
    st.integers(min_value=0, max_value=96),
)


def _chat(system: str, body: list[dict[str, str]], alternate: bool) -> list[dict[str, str]]:
    if alternate:  # user, assistant, ..., user: what an alternation-checking template accepts
        roles = ["user" if k % 2 == 0 else "assistant" for k in range(len(body))][::-1]
        body = [{**m, "role": role} for m, role in zip(body, roles, strict=True)]
    return ([{"role": "system", "content": system}] if system else []) + body


_chats = st.builds(
    _chat,
    st.sampled_from(["", "Be brief.", "You are a long-winded assistant " * 5]),
    st.lists(_message, min_size=1, max_size=12),
    st.sampled_from([True, True, False]),
)
num_chat_examples = [0]


@settings(max_examples=120)
@given(
    _chats,
    st.sampled_from(["truncate_left", "truncate_right", "truncate_left", "truncate_right", "error"]),
    st.integers(min_value=40, max_value=400),
    st.integers(min_value=1, max_value=20),
    st.sampled_from([None, ALTERNATING]),
)
def test_chat_truncation_returns_what_the_one_by_one_scan_returned(
    chat: list[dict[str, Any]], policy: str, max_model_len: int, max_tokens: int, template: str | None
) -> None:
    num_chat_examples[0] += 1
    tok = SpyTokenizer(template)
    row = prepare_chat(preparer(tok, policy, max_model_len=max_model_len, max_tokens=max_tokens), chat)
    expected = naive_chat(tok, chat, max_model_len=max_model_len, policy=policy, max_tokens=max_tokens)
    assert (row.token_ids, row.error) == expected


def test_chat_truncation_takes_log_n_renders() -> None:
    tok = SpyTokenizer()
    chat = [{"role": "system", "content": "Be brief."}]
    for k in range(128):
        chat += [{"role": "user", "content": f"question {k} " * 5}, {"role": "assistant", "content": f"answer {k} " * 5}]
    chat.append({"role": "user", "content": "last"})
    row = prepare_chat(preparer(tok, "truncate_left", max_model_len=200), chat)
    num_encoded = len(tok.encoded)
    tok.encoded.clear()
    assert row.error is None
    assert row.token_ids == naive_chat(tok, chat, max_model_len=200, policy="truncate_left", max_tokens=8)[0]
    # the whole chat, the first candidate, then a binary search over the other 255 (most
    # rendered past the character bound, so not encoded); the one-by-one scan encoded 240-odd
    assert len(tok.encoded) > 200
    assert 2 <= num_encoded <= 2 + 8


def test_a_chat_with_a_huge_message_is_bounded_and_truncated() -> None:
    tok = SpyTokenizer()
    huge = {"role": "user", "content": "lorem ipsum " * 1_000_000}  # 12 M characters
    chat = [{"role": "system", "content": "Be brief."}, huge, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and now?"}]
    row = prepare_chat(preparer(tok, "truncate_left", max_model_len=256), chat)
    assert row.error is None
    # the oldest non-system message (the huge one) goes first, and the rest fits
    assert row.token_ids == naive_chat(tok, [chat[0], *chat[2:]], max_model_len=256, policy="truncate_left", max_tokens=8)[0]
    assert max(tok.encoded) <= 256 * 81
    tok.encoded.clear()
    error_row = prepare_chat(preparer(tok, "error", max_model_len=256), chat)
    assert tok.encoded == []
    assert error_row.error is not None and error_row.error.code == "prompt_too_long"
    assert f"more than {bound(256)} characters" in error_row.error.message
    # the huge message last: nothing fits
    last = prepare_chat(preparer(tok, "truncate_right", max_model_len=256), chat[:2])
    assert last.error is not None and last.error.code == "prompt_too_long"
    assert "even one message" in last.error.message


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
        ("{{ 'a' * 2**64 }}", "would build a value of"),
        ("{{ 'a' * 10**10 }}", "would build a value of"),
        ("{{ range(10**12) | length }}", "OverflowError"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "step limit"),
    ],
)
def test_hostile_chat_templates_are_error_rows(template: str, match: str) -> None:
    for policy in ("error", "truncate_left"):
        row = prepare_chat(preparer(SpyTokenizer(template), policy, max_model_len=64), [{"role": "user", "content": "hi"}])
        assert row.error is not None and row.error.code == "chat_template_error"
        assert match in row.error.message


def test_a_template_that_prints_without_end_is_too_long_not_a_crash() -> None:
    template = "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"
    tok = SpyTokenizer(template)
    row = prepare_chat(preparer(tok, "error", max_model_len=64), [{"role": "user", "content": "hi"}])
    assert row.error is not None and row.error.code == "prompt_too_long"
    assert tok.encoded == []
