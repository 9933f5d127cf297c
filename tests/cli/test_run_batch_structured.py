"""`response_format` through `batchgen run-batch` (issue 22): json_schema and json_object requests
come back as bodies `openai`'s types parse, their content valid against the schema; a schema the
grammar engine rejects and a malformed response_format are error lines; text is no constraint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from batchgen.cli.main import main
from tests.tiny_models import make_tiny_hf_folder

ENGINE = ["--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "128"]
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "population": {"type": "integer", "minimum": 0, "maximum": 99999}},
    "required": ["city", "population"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"))


def _chat(custom_id: str, response_format: Any, **body: Any) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": f"City {custom_id} as JSON"}],
            "max_tokens": 60, "temperature": 0, "response_format": response_format, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def test_response_format_through_run_batch(tmp_path: Path, model: Path) -> None:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    json_schema = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    lines = [
        _chat("a", json_schema),
        _chat("b", json_schema, temperature=0.9, seed=4, n=2),
        _chat("c", {"type": "json_object"}),
        _chat("d", {"type": "text"}, max_tokens=3),
        _chat("e", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}),
        _chat("f", {"type": "xml"}),
        json.dumps({"custom_id": "g", "method": "POST", "url": "/v1/completions", "body": {
            "prompt": "Population:", "max_tokens": 40, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}}),
    ]
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "results.jsonl"
    assert main(["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet", *ENGINE]) == 0
    results = {r["custom_id"]: r for r in (json.loads(x) for x in out.read_text(encoding="utf-8").splitlines())}
    for custom_id in ("a", "b", "c"):
        chat = ChatCompletion.model_validate(results[custom_id]["response"]["body"])
        assert len(chat.choices) == (2 if custom_id == "b" else 1)
        for choice in chat.choices:
            if custom_id == "c":  # any object: a random model may wander until max_tokens
                if choice.finish_reason == "stop":
                    assert isinstance(json.loads(choice.message.content or ""), dict)
                continue
            assert choice.finish_reason == "stop", choice
            jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
    completion = Completion.model_validate(results["g"]["response"]["body"])
    assert completion.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(completion.choices[0].text), SCHEMA)
    text = ChatCompletion.model_validate(results["d"]["response"]["body"])
    assert text.usage is not None and text.usage.completion_tokens == 3  # no constraint: runs to max_tokens
    assert results["e"]["error"]["code"] == "bad_structured_output"
    assert "Invalid type: strnig" in results["e"]["error"]["message"]
    assert results["e"]["response"]["status_code"] == 400
    assert results["f"]["error"]["code"] == "invalid_request"
    assert "response_format.type must be text, json_object or json_schema" in results["f"]["error"]["message"]
    summary = json.loads((tmp_path / "results.jsonl.summary.json").read_text())
    assert summary["structured_outputs"]["constrained"] == 5
