"""RowPreparer on plain values: token-id prompts, reader errors, mixed chat/completion rows,
whole-number floats and NaN in per-row sampling params."""

from __future__ import annotations

import math

from batchgen.engine.sampling_params import SamplingParams
from batchgen.job.prepare import RowError, RowPreparer
from tests.tiny_models import smollm2_tokenizer


def _preparer(max_model_len: int = 8) -> RowPreparer:
    return RowPreparer(
        smollm2_tokenizer(), SamplingParams(max_tokens=3), max_model_len=max_model_len, prompt_too_long="error", job_seed=0
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
