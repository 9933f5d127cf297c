"""`task: score` through `batchgen run`: the score columns equal `LLM.score` on the same pairs
(text prompts, chat prompts, whole chats whose last assistant message is scored), error rows
for bad completions, a resumed run that scores every row exactly once, and the config rules."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen import LLM
from batchgen.cli.main import main
from batchgen.job.config import JobConfigError
from batchgen.job.config_file import job_config_from_dict
from tests.job.helpers import read_outputs, write_job
from tests.tiny_models import make_tiny_hf_folder

PAIRS = [
    (0, "The capital of France is", " Paris, a city on the Seine."),
    (1, "The capital of France is", " Lyon."),
    (2, "Two plus two equals", " four"),
    (3, "An empty completion", ""),
    (4, "The capital of France is", " Marseille, by the sea."),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _job(tmp_path: Path, model: Path, columns: dict[str, Any], **extra: Any) -> Path:
    return write_job(
        tmp_path / "job.yaml",
        {
            "model": str(model),
            "task": "score",
            "input": {"path": "data", "columns": columns},
            "output": {"path": "out", "include_logprobs": True, "include_token_ids": True},
            "engine": {"block_size": 4, "max_num_batched_tokens": 64},
            "report": False,
            **extra,
        },
    )


def test_score_columns_equal_llm_score(tmp_path: Path, model: Path) -> None:
    (tmp_path / "data").mkdir()
    table = pa.table(
        {"id": [p[0] for p in PAIRS], "prompt": [p[1] for p in PAIRS], "response": [p[2] for p in PAIRS]}
    )
    pq.write_table(table, tmp_path / "data" / "part-0.parquet")
    job = _job(tmp_path, model, {"prompt": "prompt", "completion": "response"})
    assert main(["run", str(job), "--quiet"]) == 0
    out = read_outputs(tmp_path / "out")["part-0.parquet"].to_pylist()
    assert [r["id"] for r in out] == [0, 1, 2, 3, 4]
    good = [p for p in PAIRS if p[2]]
    expected = LLM(str(model), block_size=4).score([p[1] for p in good], [p[2] for p in good], use_tqdm=False)
    rows = [r for r in out if r["error"] is None]
    assert len(rows) == len(expected)
    for row, score in zip(rows, expected, strict=True):
        assert row["finish_reason"] == "scored" and row["output"] is None
        assert row["score_num_tokens"] == score.num_tokens == row["usage"]["completion_tokens"]
        assert row["usage"]["prompt_tokens"] == len(score.prompt_token_ids)
        assert row["output_token_ids"] == list(score.completion_token_ids)
        assert row["score_logprob_sum"] == pytest.approx(score.logprob_sum, abs=1e-3)
        assert row["score_perplexity"] == math.exp(-row["score_logprob_sum"] / row["score_num_tokens"])
        assert row["score_token_logprobs"] == pytest.approx(score.token_logprobs, abs=1e-3)
    (bad,) = [r for r in out if r["error"] is not None]
    assert bad["id"] == 3 and bad["error"]["code"] == "invalid_completion"
    assert bad["score_logprob_sum"] is None and bad["finish_reason"] == "error"
    # The three pairs with one prompt share its KV.
    assert sum(r["usage"]["cached_tokens"] for r in rows) > 0
    # A second run has nothing left to do (exactly once).
    assert main(["run", str(job), "--quiet"]) == 0
    assert read_outputs(tmp_path / "out")["part-0.parquet"].to_pylist() == out


def _messages(*turns: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in turns]


def test_whole_chats_score_their_last_assistant_message(tmp_path: Path, model: Path) -> None:
    (tmp_path / "data").mkdir()
    chats = [
        _messages(("user", "Name a river."), ("assistant", "The Nile.")),
        _messages(("system", "Be short."), ("user", "Hi"), ("assistant", "Hello!")),
        _messages(("user", "No reply here.")),
        _messages(("assistant", "Only a reply.")),
    ]
    pq.write_table(pa.table({"id": [0, 1, 2, 3], "conversation": chats}), tmp_path / "data" / "part-0.parquet")
    job = _job(tmp_path, model, {"completion": "conversation"})
    assert main(["run", str(job), "--quiet"]) == 0
    out = read_outputs(tmp_path / "out")["part-0.parquet"].to_pylist()
    llm = LLM(str(model), block_size=4)
    tok = llm.tokenizer
    for row, chat in zip(out[:2], chats[:2], strict=True):
        prompt = tok.apply_chat_template(chat[:-1], add_generation_prompt=True)
        prompt_ids = tok.encode(prompt, add_special_tokens=False)
        (score,) = llm.score([prompt_ids], [chat[-1]["content"]], use_tqdm=False)
        assert row["usage"]["prompt_tokens"] == len(prompt_ids)
        assert row["score_logprob_sum"] == pytest.approx(score.logprob_sum, abs=1e-3)
    assert [r["error"]["code"] for r in out[2:]] == ["invalid_completion", "invalid_completion"]
    assert "must end with an assistant message" in out[2]["error"]["message"]
    assert "no message before" in out[3]["error"]["message"]


def test_chat_prompt_with_text_completion(tmp_path: Path, model: Path) -> None:
    (tmp_path / "data").mkdir()
    chat = _messages(("user", "Name a river."))
    pq.write_table(
        pa.table({"id": [0], "conv": [chat], "reply": ["The Nile."]}), tmp_path / "data" / "part-0.parquet"
    )
    job = _job(tmp_path, model, {"messages": "conv", "completion": "reply"})
    assert main(["run", str(job), "--quiet"]) == 0
    (row,) = read_outputs(tmp_path / "out")["part-0.parquet"].to_pylist()
    llm = LLM(str(model), block_size=4)
    prompt_ids = llm.tokenizer.encode_chat(chat, add_generation_prompt=True)
    assert row["error"] is None and row["usage"]["prompt_tokens"] == len(prompt_ids)
    (score,) = llm.score([prompt_ids], ["The Nile."], use_tqdm=False)
    assert row["score_num_tokens"] == score.num_tokens
    assert row["score_logprob_sum"] == pytest.approx(score.logprob_sum, abs=1e-3)


def test_too_long_pairs_follow_the_length_policy(tmp_path: Path, model: Path) -> None:
    (tmp_path / "data").mkdir()
    long_prompt = " ".join(f"w{i}" for i in range(60))
    pq.write_table(
        pa.table({"id": [0], "prompt": [long_prompt], "response": [" end of it"]}), tmp_path / "data" / "part-0.parquet"
    )
    for policy, code in (("error", "prompt_too_long"), ("truncate_left", None)):
        job = _job(tmp_path, model, {"prompt": "prompt", "completion": "response"},
                   engine={"block_size": 4, "max_model_len": 32}, prompt_too_long=policy)
        assert main(["run", str(job), "--quiet", "--restart"]) == 0
        (row,) = read_outputs(tmp_path / "out")["part-0.parquet"].to_pylist()
        assert (row["error"] or {}).get("code") == code
        if code is None:
            assert row["usage"]["prompt_tokens"] + row["score_num_tokens"] == 31


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"task": "score", "input": {"path": "d", "columns": {"prompt": "p"}}}, "task: score needs input.columns.completion"),
        ({"input": {"path": "d", "columns": {"prompt": "p", "completion": "c"}}}, "only a scoring job"),
        ({"task": "score", "input": {"path": "d", "columns": {"prompt": "p", "completion": "c"}},
          "sampling": {"temperature": 0}}, "sampling: task score draws no tokens"),
        ({"task": "score", "input": {"path": "d", "columns": {"prompt": "p", "messages": "m", "completion": "c"}}},
         "at most one of 'prompt', 'messages'"),
        ({"task": "score", "input": {"path": "d", "columns": {"prompt": "p", "completion": "c", "sampling_params": "s"}}},
         "task score draws no tokens; drop the column"),
    ],
)
def test_config_rules(data: dict[str, Any], message: str) -> None:
    with pytest.raises(JobConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        job_config_from_dict({"output": {"path": "o"}, **data}, source=Path("job.yaml"), base_dir=Path("."))


def test_fingerprint_of_a_generation_job_is_unchanged() -> None:
    config = job_config_from_dict(
        {"input": {"path": "d"}, "output": {"path": "o"}}, source=Path("job.yaml"), base_dir=Path(".")
    )
    fields = config.fingerprint_fields()
    assert "task" not in fields and "completion" not in fields["columns"]
    assert "presence_penalty" not in fields["sampling"] and "logit_bias" not in fields["sampling"]
    penalized = job_config_from_dict(
        {"input": {"path": "d"}, "output": {"path": "o"}, "sampling": {"logit_bias": {5: 1, 2: -3}}},
        source=Path("job.yaml"), base_dir=Path("."),
    )
    assert penalized.fingerprint_fields()["sampling"]["logit_bias"] == [[2, -3.0], [5, 1.0]]
