"""OpenAI batch files next to their responses (`run-batch`): the output file may share the
request file's folder, but it may never be a request file, and ``--restart`` never deletes one;
a request file's identity (size, requests, sha256 of the file) is what the manifest records."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from batchgen.cli.main import main
from batchgen.io import InputError, InputIdentity, JobFolder, Manifest, ShardRecord
from batchgen.io.openai_batch import inspect_openai_batch
from batchgen.job.openai_batch import check_output_files_not_inputs
from batchgen.job.resume import open_manifest

REQUEST = json.dumps(
    {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x", "max_tokens": 1}}
)


def _requests(path: Path) -> Path:
    path.write_text(REQUEST + "\n\n" + REQUEST.replace('"a"', '"b"') + "\n", encoding="utf-8")
    return path


def test_request_file_identity(tmp_path: Path) -> None:
    path = _requests(tmp_path / "requests.jsonl")
    identity = inspect_openai_batch(path, name="results.jsonl").identity()
    data = path.read_bytes()
    assert identity == InputIdentity(str(path), len(data), 2, hashlib.sha256(data).hexdigest())
    path.write_text(path.read_text().replace('"x"', '"y"'), encoding="utf-8")  # same size
    assert not inspect_openai_batch(path).identity().matches(identity)


def test_output_file_may_not_be_a_request_file(tmp_path: Path) -> None:
    path = _requests(tmp_path / "requests.jsonl")
    check_output_files_not_inputs(tmp_path, ["results.jsonl"], [path])  # next to it: fine
    with pytest.raises(InputError, match="is the input file"):
        check_output_files_not_inputs(tmp_path, ["requests.jsonl"], [path])
    (tmp_path / "link").mkdir()
    (tmp_path / "link" / "requests.jsonl").symlink_to(path)
    with pytest.raises(InputError, match="is the input file"):
        check_output_files_not_inputs(tmp_path / "link", ["requests.jsonl"], [path])


def test_run_batch_refuses_to_overwrite_its_request_file(tmp_path: Path) -> None:
    path = _requests(tmp_path / "requests.jsonl")
    before = path.read_bytes()
    assert main(["run-batch", "-i", str(path), "-o", str(path), "--quiet", "--restart"]) == 2
    assert path.read_bytes() == before
    assert not (tmp_path / "manifest.json").exists()


def test_restart_never_deletes_a_request_file(tmp_path: Path) -> None:
    # An earlier run wrote results.jsonl; this run reads it as its requests, in the same folder.
    path = _requests(tmp_path / "results.jsonl")
    old = Manifest.create(tmp_path, {"job": 1}, job_time="2026-11-30T00:00:00")
    identity = InputIdentity(str(tmp_path / "q.jsonl"), 1, 2, "")
    old.mark_committed(
        "results.jsonl",
        ShardRecord(
            input_path=identity.path,
            input_size=identity.size,
            input_footer_hash=identity.footer_hash,
            num_input_rows=2,
            num_output_rows=2,
            rows_by_status={"ok": 2, "error": 0},
            error_codes={},
            prompt_tokens=0,
            cached_tokens=0,
            completion_tokens=0,
            wall_s=0.0,
        ),
    )
    response = {"id": "batch_req_1", "custom_id": "a", "response": None, "error": None}
    (tmp_path / "new.jsonl").write_text(json.dumps(response) + "\n", encoding="utf-8")
    open_manifest(
        JobFolder(tmp_path), {"job": 2}, ["new.jsonl"], restart=True, job_time="2026-12-01T00:00:00", inputs=[path]
    )
    assert path.is_file()  # listed by the old manifest, but an input now
    assert not (tmp_path / "new.jsonl").exists()  # this run's output name: discarded
