"""`batchgen run-batch`: an OpenAI Batch API request file in, one response line per request
line out (errors as error objects), parseable by the `openai` package, exactly once across a
kill -9 and a re-run, whose file then equals an uninterrupted run's; `--max-tokens` fills in
requests without one (16 by default); an edited request file stops a resume (exit 2).

The run's side files (manifest, summary) are found through `_side_file` only, the one place
that knows their names.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from batchgen.cli.main import main
from tests.job.helpers import subprocess_env
from tests.tiny_models import make_tiny_hf_folder

REPO = Path(__file__).resolve().parents[2]
KILL_WRAPPER = Path(__file__).resolve().parent / "run_batch_kill.py"
ENGINE = ["--max-num-seqs", "4", "--max-num-batched-tokens", "64", "--max-model-len", "96"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _request(custom_id: str | None, url: str = "/v1/chat/completions", **body: Any) -> str:
    request: dict[str, Any] = {"method": "POST", "url": url, "body": {"model": "gpt-4o-mini", **body}}
    if custom_id is not None:
        request["custom_id"] = custom_id
    return json.dumps(request)


def _chat(custom_id: str | None, text: str, **body: Any) -> str:
    if "max_completion_tokens" not in body:
        body.setdefault("max_tokens", 4)
    body.setdefault("temperature", 0)
    return _request(custom_id, messages=[{"role": "user", "content": text}], **body)


MIXED = [
    _chat("a", "Name a river."),
    _request("b", "/v1/completions", prompt="Once upon a time", max_tokens=3, temperature=0, n=2),
    '{"custom_id": "broken", "body": ',
    _request("c", "/v1/embeddings", input="x"),
    _chat("a", "A second request with the id of the first."),
    _chat("long", "word " * 200),
    _chat(None, "No custom id."),
    _chat("d", "Say hi.", logprobs=True, max_completion_tokens=2),
    _chat("e", "Best of.", best_of=3),
    _chat("f", "Top three.", logprobs=True, top_logprobs=3, max_tokens=2),
    _request("g", "/v1/completions", prompt="Top two", max_tokens=2, temperature=0, logprobs=2),
]
EXPECTED_ERRORS = {
    3: "invalid_json",
    4: "unsupported_url",
    5: "duplicate_id",
    6: "prompt_too_long",
    7: "missing_custom_id",
    9: "unsupported_field",
}


def _side_file(output: Path, kind: str) -> Path:
    """The side file `kind` ("manifest", "summary") of the run that writes response file
    `output`: named after it, beside it (results.jsonl.manifest.json)."""
    return output.parent / f"{output.name}.{kind}.json"


def _read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_mixed_file_gives_one_line_per_request_in_order(tmp_path: Path, model: Path) -> None:
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(MIXED) + "\n", encoding="utf-8")
    out = tmp_path / "results" / "results.jsonl"
    code = main(["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet", *ENGINE])
    assert code == 0
    lines = _read_lines(out)
    assert len(lines) == len(MIXED)
    assert [line["id"] for line in lines] == [f"batch_req_{i}" for i in range(1, len(MIXED) + 1)]
    assert [line["custom_id"] for line in lines] == ["a", "b", None, "c", "a", "long", None, "d", "e", "f", "g"]
    for number, line in enumerate(lines, start=1):
        if number in EXPECTED_ERRORS:
            assert line["error"]["code"] == EXPECTED_ERRORS[number], line
            assert line["response"]["status_code"] == 400
            assert line["response"]["body"]["error"]["code"] == EXPECTED_ERRORS[number]
            continue
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        body = line["response"]["body"]
        assert body["model"] == "gpt-4o-mini"  # echoed from the request
        usage = body["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert 0 <= usage["prompt_tokens_details"]["cached_tokens"] <= usage["prompt_tokens"]
        if number in (2, 11):
            completion = Completion.model_validate(body)
            assert [c.index for c in completion.choices] == ([0, 1] if number == 2 else [0])
            assert all(c.finish_reason in ("stop", "length") for c in completion.choices)
            assert usage["completion_tokens"] <= 6
        else:
            chat = ChatCompletion.model_validate(body)
            assert chat.object == "chat.completion" and len(chat.choices) == 1
            choice = chat.choices[0]
            assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
            assert choice.finish_reason in ("stop", "length")
    # logprobs: true gives one entry per generated token
    logprobs = lines[7]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == lines[7]["response"]["body"]["usage"]["completion_tokens"] <= 2
    assert all(entry["logprob"] <= 0 for entry in logprobs)
    assert lines[0]["response"]["body"]["choices"][0]["logprobs"] is None
    assert "best_of" in lines[8]["error"]["message"]
    # top_logprobs: the k best tokens per position, best first; greedy picks the best
    for entry in lines[9]["response"]["body"]["choices"][0]["logprobs"]["content"]:
        values = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert entry["logprob"] == values[0] and entry["token"] == entry["top_logprobs"][0]["token"]
    completion_logprobs = lines[10]["response"]["body"]["choices"][0]["logprobs"]
    assert len(completion_logprobs["tokens"]) == len(completion_logprobs["top_logprobs"])
    assert all(len(top) <= 2 for top in completion_logprobs["top_logprobs"])

    # the state of the run sits next to the output file; a re-run skips the committed file
    assert _side_file(out, "manifest").is_file()
    before = out.read_bytes()
    assert main(["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet", *ENGINE]) == 0
    assert out.read_bytes() == before
    summary = json.loads(_side_file(out, "summary").read_text())
    assert summary["shards"] == {"committed_this_run": 0, "skipped": 1}


def _run_batch(args: list[str], wrapper: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    head = [sys.executable, "-m", "batchgen"] if wrapper is None else [sys.executable, str(KILL_WRAPPER), *wrapper]
    return subprocess.run(
        [*head, *args], cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300, check=False
    )


def _args(requests: Path, out: Path, model: Path, *extra: str) -> list[str]:
    return ["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet", *ENGINE, *extra]


def _write_requests(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_requests_without_max_tokens_get_the_max_tokens_flag(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """16 new tokens by default (the random model does not stop early: every reply hits the
    limit); `--max-tokens 5` changes that; a request's own limit wins either way."""
    story = [{"role": "user", "content": "Tell me a long story about a river."}]
    requests = _write_requests(tmp_path / "requests.jsonl", [
        _request("chat", messages=story, temperature=0),
        _request("completion", "/v1/completions", prompt="Once upon a time", temperature=0),
        _request("sampled", messages=story, temperature=0.9),
        _request("own", messages=story, temperature=0, max_tokens=3),
        _request("own_completion_tokens", messages=story, temperature=0, max_completion_tokens=4),
    ])
    for flag, limit in ((None, 16), (5, 5)):
        out = tmp_path / f"max-{flag}" / "results.jsonl"
        assert main(_args(requests, out, model, *([] if flag is None else ["--max-tokens", str(flag)]))) == 0
        lines = _read_lines(out)
        assert [line["error"] for line in lines] == [None] * 5
        bodies = [line["response"]["body"] for line in lines]
        assert [b["usage"]["completion_tokens"] for b in bodies] == [limit, limit, limit, 3, 4]
        assert [b["choices"][0]["finish_reason"] for b in bodies] == ["length"] * 5
    # The limit is part of the configuration: another one for an existing response file stops.
    capsys.readouterr()
    out = tmp_path / "max-None" / "results.jsonl"
    before = out.read_bytes()
    assert main(_args(requests, out, model, "--max-tokens", "5")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_tokens" in err
    assert out.read_bytes() == before


# Greedy and sampled requests (seed derived from the job's, or the request's own), n = 2 and a
# bad line: an uninterrupted run and a killed-then-rerun one must write the same file.
KILL_REQUESTS = [
    *[_chat(f"r{i}", f"Question {i}: what is {i} plus {i}?") for i in range(3)],
    "{bad json",
    _chat("r3", "Question 3: what is 3 plus 3?", temperature=0.9),
    _chat("r4", "Question 4: tell a story.", temperature=0.9, seed=7),
    _request("r5", "/v1/completions", prompt="Once upon a time", max_tokens=4, temperature=0.8, n=2),
    _chat("r6", "Question 6: what is 6 plus 6?"),
]
_CREATED = re.compile(rb'"created": [0-9]+, ')


def _without_created(data: bytes) -> bytes:
    """The response file's bytes less the `created` timestamps (one per response body)."""
    assert len(_CREATED.findall(data)) == 7  # the ok lines: the drop is not vacuous
    return _CREATED.sub(b"", data)


@pytest.fixture(scope="module")
def uninterrupted(model: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The response file of KILL_REQUESTS from one run that nothing interrupts."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    out = folder / "results.jsonl"
    run = _run_batch([*_args(_write_requests(folder / "requests.jsonl", KILL_REQUESTS), out, model),
                      "--set", "input.batch_rows=2"])
    assert run.returncode == 0, run.stderr
    return out.read_bytes()


@pytest.mark.slow  # a job run in a subprocess
@pytest.mark.parametrize("moment", [["write", "1"], ["write", "2"], ["after_rename", "1"]])
def test_kill_then_rerun_gives_the_uninterrupted_file(
    tmp_path: Path, model: Path, moment: list[str], uninterrupted: bytes
) -> None:
    requests = _write_requests(tmp_path / "requests.jsonl", KILL_REQUESTS)
    out = tmp_path / "results.jsonl"
    args = [*_args(requests, out, model), "--set", "input.batch_rows=2"]
    killed = _run_batch(args, wrapper=moment)
    assert killed.returncode == -9, killed.stderr
    if moment[0] == "write":
        assert not out.exists()  # nothing partial under the final name
    else:
        assert out.exists()  # renamed, but the manifest never heard of it
    rerun = _run_batch(args)
    assert rerun.returncode == 0, rerun.stderr
    assert _without_created(out.read_bytes()) == _without_created(uninterrupted)
    lines = _read_lines(out)
    assert [line["custom_id"] for line in lines] == ["r0", "r1", "r2", None, "r3", "r4", "r5", "r6"]
    assert [line["error"] is None for line in lines] == [True] * 3 + [False] + [True] * 4
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    manifest = json.loads(_side_file(out, "manifest").read_text())
    assert list(manifest["shards"]) == ["results.jsonl"]
    summary = json.loads(_side_file(out, "summary").read_text())
    committed = 0 if moment[0] == "after_rename" else 1
    assert summary["shards"] == {"committed_this_run": committed, "skipped": 1 - committed}


@pytest.mark.parametrize(
    ("before", "edit"),
    [
        ("completed", "one_body_changed"),
        ("completed", "one_line_appended"),
        # a response file renamed into place by a run killed before its manifest record: it
        # was adopted unchecked (exit 0, the old answers kept) before the pending record
        pytest.param("killed_after_rename", "one_body_changed", marks=pytest.mark.slow),  # a subprocess
        pytest.param("killed_after_rename", "one_line_appended", marks=pytest.mark.slow),
    ],
)
def test_an_edited_request_file_stops_the_resume_with_exit_2(
    tmp_path: Path, model: Path, capsys: pytest.CaptureFixture[str], before: str, edit: str
) -> None:
    """Whether the first run recorded its response file or was killed right after renaming it
    into place, a request file edited since (same line count, or one more line) stops the rerun
    with one message naming the request file, and the response file is left as it was."""
    lines = [_chat(f"r{i}", f"Question {i}: what is {i} plus {i}?") for i in range(3)]
    requests = _write_requests(tmp_path / "requests.jsonl", lines)
    out = tmp_path / "results.jsonl"
    if before == "completed":
        assert main(_args(requests, out, model)) == 0
    else:
        killed = _run_batch(_args(requests, out, model), wrapper=["after_rename", "1"])
        assert killed.returncode == -9, killed.stderr
    written = out.read_bytes()
    if edit == "one_body_changed":  # the same size and line count: only the contents tell
        lines[1] = _chat("r1", "Question 1: what is 7 plus 7?")
    else:
        lines.append(_chat("r3", "Question 3: what is 3 plus 3?"))
    _write_requests(requests, lines)
    capsys.readouterr()
    assert main(_args(requests, out, model)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert str(requests) in err
    assert out.read_bytes() == written


def test_a_file_system_error_is_one_message_and_exit_1(
    tmp_path: Path, model: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """run-batch reports an OSError that escapes the job as `batchgen run` does: one line, exit 1."""
    from batchgen.job import run

    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(run, "run_pipeline_sync", no_space)
    requests = tmp_path / "requests.jsonl"
    requests.write_text(_chat("a", "Hello") + "\n", encoding="utf-8")
    out = tmp_path / "results" / "results.jsonl"
    code = main(["run-batch", "-i", str(requests), "-o", str(out), "--model", str(model), "--quiet", *ENGINE])
    err = capsys.readouterr().err
    assert code == 1
    assert err.strip().splitlines() == ["error: [Errno 28] No space left on device"]
    assert not out.exists()
