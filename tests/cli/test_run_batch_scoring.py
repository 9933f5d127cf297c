"""`batchgen run-batch` with the sampling fields people bring from OpenAI (issue 21):
frequency/presence penalties, logit_bias with string keys and min_tokens are honoured, and the
classic scoring request (/v1/completions with echo, logprobs and max_tokens 0) returns the
prompt's token log-probabilities in OpenAI's shape, equal to `LLM.generate`'s prompt logprobs;
echo with max_tokens > 0 puts the prompt before the output in text and logprobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchgen import LLM, SamplingParams
from batchgen.cli.main import main
from tests.tiny_models import make_tiny_hf_folder

ENGINE = ["--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "96"]
PROMPT = "The capital of France is Paris"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _completion(custom_id: str, **body: Any) -> str:
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": {"model": "m", **body}}
    )


def _run(tmp_path: Path, model: Path, lines: list[str]) -> list[dict[str, Any]]:
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out" / "results.jsonl"
    assert main(["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet", *ENGINE]) == 0
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_echo_max_tokens_zero_is_the_scoring_request(tmp_path: Path, model: Path) -> None:
    lines = _run(
        tmp_path,
        model,
        [
            _completion("score", prompt=PROMPT, echo=True, logprobs=2, max_tokens=0),
            _completion("plain", prompt=PROMPT, echo=True, max_tokens=0),
        ],
    )
    body = lines[0]["response"]["body"]
    # (not openai.types.Completion: its types say float where the API, like vLLM, writes null
    # for the first echoed token)
    (choice,) = body["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    llm = LLM(str(model))
    ref = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2), use_tqdm=False)[0]
    ids = list(ref.prompt_token_ids)
    assert body["usage"]["prompt_tokens"] == len(ids) and body["usage"]["completion_tokens"] == 0
    logprobs = choice["logprobs"]
    tok = llm.tokenizer
    assert logprobs["tokens"] == [tok.decode([t], skip_special_tokens=False) for t in ids]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert ref.prompt_logprobs is not None
    for i in range(1, len(ids)):
        entry = ref.prompt_logprobs[i]
        assert entry is not None
        assert logprobs["token_logprobs"][i] == pytest.approx(entry[ids[i]], abs=1e-4)
        top = logprobs["top_logprobs"][i]
        assert len(top) == 2 and max(top.values()) == pytest.approx(max(entry.values()), abs=1e-4)
    assert logprobs["text_offset"][0] == 0
    plain = lines[1]["response"]["body"]["choices"][0]
    assert plain["text"] == PROMPT and plain["logprobs"] is None


def test_echo_with_output_puts_the_prompt_first(tmp_path: Path, model: Path) -> None:
    (line,) = _run(tmp_path, model, [_completion("e", prompt=PROMPT, echo=True, logprobs=1, max_tokens=3, temperature=0)])
    (choice,) = line["response"]["body"]["choices"]
    usage = line["response"]["body"]["usage"]
    assert choice["text"].startswith(PROMPT) and len(choice["text"]) > len(PROMPT)
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == usage["prompt_tokens"] + usage["completion_tokens"]
    assert logprobs["token_logprobs"][0] is None
    assert all(v is not None for v in logprobs["token_logprobs"][1:])


def test_penalties_logit_bias_and_min_tokens_are_honoured(tmp_path: Path, model: Path) -> None:
    llm = LLM(str(model))
    eos = llm.tokenizer.eos_token_id
    assert eos is not None
    lines = _run(
        tmp_path,
        model,
        [
            _completion("bias", prompt="Hi", max_tokens=8, temperature=0, logit_bias={str(eos): 100}, min_tokens=3),
            _completion("pen", prompt="Hi", max_tokens=8, temperature=0, frequency_penalty=1.5, presence_penalty=1.0),
            _completion("bad", prompt="Hi", max_tokens=8, logit_bias={"999999": 1}),
        ],
    )
    bias = lines[0]["response"]["body"]
    assert lines[0]["error"] is None
    assert bias["usage"]["completion_tokens"] == 4 and bias["choices"][0]["finish_reason"] == "stop"
    ref = llm.generate(
        ["Hi"], SamplingParams(max_tokens=8, temperature=0, frequency_penalty=1.5, presence_penalty=1.0), use_tqdm=False
    )[0].outputs[0]
    assert lines[1]["response"]["body"]["choices"][0]["text"] == ref.text
    assert lines[2]["error"]["code"] == "invalid_request"  # the engine refuses it: ids are checked against the vocabulary
    assert "logit_bias" in lines[2]["error"]["message"] and "999999" in lines[2]["error"]["message"], lines[2]
