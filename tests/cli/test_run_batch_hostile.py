"""`batchgen run-batch` over a request file of hostile lines: exit 0, one response line per
request line, each hostile one an error line with status 400 (issue 20, defects 1 and 9). Before
the fix the first such line ended the batch with a traceback, on every rerun."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchgen.cli.main import main
from tests.tiny_models import make_tiny_hf_folder

ENGINE = ["--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "96"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _completion(custom_id: str, **body: Any) -> str:
    body.setdefault("prompt", "Once upon a time")
    body.setdefault("max_tokens", 2)
    body.setdefault("temperature", 0)
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


HOSTILE = [
    (_completion("ok-1"), None),
    (_completion("huge-max-tokens").replace('"max_tokens": 2', '"max_tokens": 1e300'), "invalid_request"),
    (_completion("huge-n", n=2**64), "invalid_request"),
    (_completion("huge-seed", seed=2**63), "invalid_request"),
    (_completion("surrogate", prompt="hi \ud83d"), "invalid_utf8"),
    ("[" * 100_000 + "]" * 100_000, "invalid_json"),
    (_completion("nan").replace('"temperature": 0', '"temperature": NaN'), "invalid_json"),
    (_completion("long-line", prompt="z" * 400_000), "line_too_long"),
    (_completion("ok-2"), None),
]


def test_hostile_lines_are_error_lines_and_the_batch_finishes(tmp_path: Path, model: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(line for line, _ in HOSTILE) + "\n", encoding="utf-8")
    out = tmp_path / "results.jsonl"
    args = ["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet",
            "--set", "input.max_line_bytes=300000", *ENGINE]
    assert main(args) == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == len(HOSTILE)
    for number, (line, (_, code)) in enumerate(zip(lines, HOSTILE, strict=True), start=1):
        assert line["id"] == f"batch_req_{number}"
        if code is None:
            assert line["error"] is None and line["response"]["status_code"] == 200
        else:
            assert line["error"]["code"] == code, (number, line["error"])
            assert line["response"]["status_code"] == 400
    assert main(args) == 0  # a rerun resumes: the committed file is kept as it is
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(HOSTILE)
