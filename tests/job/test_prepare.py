"""The prepare stage on its own (no engine): length policies, chats truncated by whole messages,
the pinned time of chat templates, ids repeated across shards; token-id prompts, reader errors,
mixed chat/completion rows, whole-number floats and NaN in per-row sampling params."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pytest

from batchgen.engine.sampling_params import SamplingParams
from batchgen.job.prepare import PreparedRow, RowError, RowPreparer
from batchgen.tokenizer.chat_template import render_chat_template
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import smollm2_tokenizer

NOW = datetime(2026, 3, 4, 5, 6, 7)
MAX_MODEL_LEN = 40
WORDS = " ".join(f"w{i}" for i in range(60))  # about 120 tokens


def preparer(policy: str, max_tokens: int = 8, max_model_len: int = MAX_MODEL_LEN) -> RowPreparer:
    return RowPreparer(
        smollm2_tokenizer(),
        SamplingParams(max_tokens=max_tokens),
        max_model_len=max_model_len,
        prompt_too_long=policy,  # type: ignore[arg-type]
        job_seed=0,
        now=NOW,
    )


def prepare_prompts(p: RowPreparer, prompts: list[str], shard: int = 0, first_id: int = 0) -> list[PreparedRow]:
    ids = list(range(first_id, first_id + len(prompts)))
    return p.prepare(shard, 0, ids, prompts, None, None, [() for _ in prompts])


def prepare_chats(p: RowPreparer, chats: list[list[dict[str, Any]]]) -> list[PreparedRow]:
    return p.prepare(0, 0, list(range(len(chats))), None, chats, None, [() for _ in chats])


def test_truncate_left_keeps_the_end_and_truncate_right_the_start() -> None:
    full = smollm2_tokenizer().encode(WORDS)
    assert len(full) > MAX_MODEL_LEN
    budget = MAX_MODEL_LEN - 8  # room for all max_tokens
    (left,) = prepare_prompts(preparer("truncate_left"), [WORDS])
    (right,) = prepare_prompts(preparer("truncate_right"), [WORDS])
    assert left.error is None and right.error is None
    assert left.token_ids == tuple(full[-budget:])
    assert right.token_ids == tuple(full[:budget])
    assert left.token_ids != right.token_ids


@pytest.mark.parametrize("policy", ["truncate_left", "truncate_right"])
@pytest.mark.parametrize("max_tokens", [MAX_MODEL_LEN, MAX_MODEL_LEN + 50])
def test_truncation_that_leaves_no_room_is_an_error_row(policy: str, max_tokens: int) -> None:
    (row,) = prepare_prompts(preparer(policy, max_tokens=max_tokens), [WORDS])
    assert row.error is not None and row.error.code == "prompt_too_long"
    assert "max_tokens" in row.error.message
    assert row.token_ids is None
    # a prompt that fits is not touched, whatever max_tokens
    (short,) = prepare_prompts(preparer(policy, max_tokens=max_tokens), ["Hello there"])
    assert short.error is None
    assert short.token_ids == tuple(smollm2_tokenizer().encode("Hello there"))


def _chat_ids(messages: list[dict[str, Any]]) -> tuple[int, ...]:
    tok = smollm2_tokenizer()
    assert tok.chat_template is not None
    text = render_chat_template(
        tok.chat_template,
        messages,
        add_generation_prompt=True,
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
        strftime_now=NOW.strftime,
    )
    return tuple(tok.encode(text, add_special_tokens=False))


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "First question about " + " ".join(f"a{i}" for i in range(12))},
    {"role": "assistant", "content": "An answer about " + " ".join(f"b{i}" for i in range(40))},
    {"role": "user", "content": "Short follow-up?"},
]


def test_chats_truncate_by_whole_messages() -> None:
    budget = 72
    max_model_len = budget + 8
    assert len(_chat_ids(CHAT)) > max_model_len
    (left,) = prepare_chats(preparer("truncate_left", max_model_len=max_model_len), [CHAT])
    (right,) = prepare_chats(preparer("truncate_right", max_model_len=max_model_len), [CHAT])
    # left: the oldest non-system messages go, the system prompt and the last question stay
    assert left.error is None
    assert left.token_ids == _chat_ids([CHAT[0], CHAT[3]])
    # right: the newest messages go (and an assistant turn left last), the first question stays
    assert right.error is None
    assert right.token_ids == _chat_ids(CHAT[:2])
    # both end with the generation prompt, whole
    header = smollm2_tokenizer().encode("<|im_start|>assistant\n", add_special_tokens=False)
    for row in (left, right):
        assert row.token_ids is not None and len(row.token_ids) <= budget
        assert list(row.token_ids[-len(header) :]) == header


def test_a_chat_whose_last_message_alone_is_too_long_is_an_error_row() -> None:
    chat = [{"role": "user", "content": WORDS}]
    for policy in ("truncate_left", "truncate_right"):
        (row,) = prepare_chats(preparer(policy), [chat])
        assert row.error is not None and row.error.code == "prompt_too_long"
        assert "whole messages" in row.error.message


def test_chat_templates_see_the_pinned_time() -> None:
    tok = smollm2_tokenizer()
    template = "{{ strftime_now('%Y-%m-%d %H:%M:%S') }}|{{ messages[0].content }}"
    dated = Tokenizer(tok.backend, bos_token=tok.bos_token, eos_token=tok.eos_token, chat_template=template)
    p = RowPreparer(
        dated,
        SamplingParams(max_tokens=8),
        max_model_len=MAX_MODEL_LEN,
        prompt_too_long="error",
        job_seed=0,
        now=NOW,
    )
    (row,) = prepare_chats(p, [[{"role": "user", "content": "hi"}]])
    assert row.token_ids == tuple(tok.encode("2026-03-04 05:06:07|hi", add_special_tokens=False))


def test_ids_repeated_across_shards_are_counted_not_failed() -> None:
    p = preparer("error")
    first = prepare_prompts(p, ["a", "b", "c"], shard=0, first_id=0)
    second = prepare_prompts(p, ["d", "e", "f"], shard=1, first_id=1)  # ids 1 and 2 again
    assert all(r.error is None for r in first + second)
    assert p.num_duplicate_ids_across_shards == 2
    assert p.num_ids_tracked == 4
    # a repeat inside one shard stays an error row and is not counted across shards
    (dup,) = p.prepare(1, 3, [1], ["g"], None, None, [()])
    assert dup.error is not None and dup.error.code == "duplicate_id"
    assert p.num_duplicate_ids_across_shards == 2
    # ints and their decimal strings are different ids
    prepare_prompts(p, ["h"], shard=2, first_id=7)
    p.prepare(3, 0, ["7"], ["i"], None, None, [()])
    assert p.num_duplicate_ids_across_shards == 2


def _preparer(max_model_len: int = 8) -> RowPreparer:
    return RowPreparer(
        smollm2_tokenizer(),
        SamplingParams(max_tokens=3),
        max_model_len=max_model_len,
        prompt_too_long="error",
        job_seed=0,
        now=NOW,
    )


def test_token_ids_checked_against_the_vocabulary_and_length() -> None:
    vocab = smollm2_tokenizer().vocab_size
    values = [[1, 2, 3], [vocab], [-1], [], None, list(range(1, 20)), [True]]
    rows = _preparer().prepare(0, 0, list(range(7)), None, None, None, [()] * 7, token_ids=values)
    assert rows[0].error is None and rows[0].token_ids == (1, 2, 3)
    assert [r.error.code if r.error else None for r in rows[1:]] == [
        "invalid_prompt", "invalid_prompt", "invalid_prompt", "invalid_prompt", "prompt_too_long", "invalid_prompt",
    ]
    assert rows[1].error is not None and f"[0, {vocab})" in rows[1].error.message


def test_reader_errors_and_mixed_chat_and_prompt_rows() -> None:
    tokenizer = smollm2_tokenizer()
    chat = [{"role": "user", "content": "Hi"}]
    rows = _preparer(max_model_len=256).prepare(
        0, 0, ["a", "b", "c"], ["Hi", None, "x"], [None, chat, None], None, [()] * 3,
        row_errors=[None, None, RowError("invalid_json", "line 3 is not valid JSON")],
    )
    assert rows[0].token_ids == tuple(tokenizer.encode("Hi", add_special_tokens=True))
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(chat, add_generation_prompt=True), add_special_tokens=False)
    assert rows[1].error is None and rows[1].token_ids == tuple(chat_ids)
    assert rows[2].error == RowError("invalid_json", "line 3 is not valid JSON")


def test_whole_number_floats_and_nan_in_sampling_params() -> None:
    sampling = [
        {"max_tokens": 2.0, "n": 2.0, "temperature": math.nan, "seed": 7.0},
        {"max_tokens": 2.5},
        {"max_tokens": math.nan},
    ]
    rows = _preparer().prepare(0, 0, [1, 2, 3], ["a", "b", "c"], None, sampling, [()] * 3)
    assert rows[0].error is None and rows[0].params == SamplingParams(max_tokens=2, n=2, seed=7)
    assert rows[0].num_samples == 2 and rows[0].seed == 7
    assert rows[1].error is not None and rows[1].error.code == "invalid_sampling_params"
    assert rows[2].error is None and rows[2].params == SamplingParams(max_tokens=3)
