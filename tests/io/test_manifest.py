"""manifest.json: round trip, fingerprint diffs, corrupt files, recomputed shard records."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest

from batchgen.io import (
    BadShard,
    InputError,
    InputIdentity,
    Manifest,
    OutputRow,
    OutputShardWriter,
    ShardRecord,
    output_schema,
    rows_to_batch,
    summarize_output_shard,
)

FINGERPRINT: dict[str, object] = {
    "model": {"path": "smol.gguf", "fingerprint": "ab12"},
    "sampling": {"max_tokens": 128, "temperature": 0.0, "stop": ["\n"]},
    "seed": 0,
}
JOB_TIME = "2026-11-30T23:40:00"


def _record(**changes: object) -> ShardRecord:
    values: dict[str, object] = {
        "input_path": "/data/part-0.parquet",
        "input_size": 4096,
        "input_footer_hash": "f00d",
        "num_input_rows": 10,
        "num_output_rows": 20,
        "rows_by_status": {"ok": 18, "error": 2},
        "error_codes": {"prompt_too_long": 2},
        "prompt_tokens": 1000,
        "cached_tokens": 400,
        "completion_tokens": 300,
        "wall_s": 1.5,
    }
    values.update(changes)
    return ShardRecord(**values)


def test_load_absent_is_none(tmp_path: Path) -> None:
    assert Manifest.load(tmp_path) is None


def test_round_trip(tmp_path: Path) -> None:
    manifest = Manifest.create(tmp_path, FINGERPRINT, job_time=JOB_TIME)
    assert (tmp_path / "manifest.json").exists()  # create saves
    manifest.mark_committed("part-0.parquet", _record())
    manifest.mark_committed("part-1.parquet", _record(input_path="/data/part-1.parquet"))
    assert os.listdir(tmp_path) == ["manifest.json"]  # no temporary file left
    loaded = Manifest.load(tmp_path)
    assert loaded is not None
    assert loaded.fingerprint == FINGERPRINT
    assert loaded.job_time == JOB_TIME
    assert loaded.committed() == {
        "part-0.parquet": _record(),
        "part-1.parquet": _record(input_path="/data/part-1.parquet"),
    }
    assert loaded.diff_fingerprint(FINGERPRINT) == []
    # the stored form is JSON: tuples compare equal to lists
    as_tuples = {
        "model": {"path": "smol.gguf", "fingerprint": "ab12"},
        "sampling": {"max_tokens": 128, "temperature": 0.0, "stop": ("\n",)},
        "seed": 0,
    }
    assert loaded.diff_fingerprint(as_tuples) == []
    assert ShardRecord.from_json(_record().to_json()) == _record()


def test_diff_fingerprint_lines(tmp_path: Path) -> None:
    manifest = Manifest.create(tmp_path, FINGERPRINT, job_time=JOB_TIME)
    changed = {
        "model": {"path": "smol.gguf", "fingerprint": "cd34"},
        "sampling": {"max_tokens": 64, "temperature": 0.0, "stop": ["\n"], "top_p": 0.9},
        "order": "input",
    }
    assert manifest.diff_fingerprint(changed) == [
        "model.fingerprint: 'ab12' -> 'cd34'",
        "sampling.max_tokens: 128 -> 64",
        "sampling.top_p: added (0.9)",
        "seed: removed (was 0)",
        "order: added ('input')",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        json.dumps({"format": 99, "fingerprint": {}, "shards": {}}),
        json.dumps({"format": 2, "fingerprint": {}, "job_time": "t", "shards": {"p": {"input_path": "x"}}}),
        # the format before input identities: a resume cannot check its shards
        json.dumps({"format": 1, "fingerprint": {}, "shards": {}}),
        json.dumps({"format": 2, "fingerprint": {}, "shards": {}}),  # no job_time
    ],
)
def test_load_corrupt_manifest(tmp_path: Path, text: str) -> None:
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(
        InputError, match=f"{tmp_path}/manifest.json: not a valid batchgen manifest"
    ):
        Manifest.load(tmp_path)


def test_fingerprint_must_be_json(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not JSON-able"):
        Manifest.create(tmp_path, {"path": Path("x")}, job_time=JOB_TIME)
    assert os.listdir(tmp_path) == []


def _row(row_id: int, error_code: str | None = None) -> OutputRow:
    return OutputRow(
        id=row_id,
        sample_index=0,
        passthrough=(),
        output=None if error_code else f"out {row_id}",
        finish_reason="error" if error_code else "length",
        stop_reason=None,
        prompt_tokens=10 + row_id,
        completion_tokens=0 if error_code else 5,
        cached_tokens=4,
        error_code=error_code,
        error_message="bad row" if error_code else None,
        seed=row_id,
    )


def test_summarize_output_shard(tmp_path: Path) -> None:
    schema = output_schema(pa.int64(), pa.schema([]), with_token_ids=False, with_logprobs=False)
    rows = [
        _row(0),
        _row(1, "prompt_too_long"),
        _row(2),
        _row(3, "null_prompt"),
        _row(4, "prompt_too_long"),
    ]
    with OutputShardWriter(tmp_path, "p.parquet", schema) as writer:
        writer.write(rows_to_batch(rows[:2], schema))
        writer.write(rows_to_batch(rows[2:], schema))
        path = writer.commit()
    record = summarize_output_shard(path, input=InputIdentity("/in/p.parquet", 77, 5, "ab"))
    assert record == ShardRecord(
        input_path="/in/p.parquet",
        input_size=77,
        input_footer_hash="ab",
        num_input_rows=5,
        num_output_rows=5,
        rows_by_status={"ok": 2, "error": 3},
        error_codes={"null_prompt": 1, "prompt_too_long": 2},
        prompt_tokens=60,
        cached_tokens=20,
        completion_tokens=10,
        wall_s=0.0,
    )


def test_summarize_unreadable_shard(tmp_path: Path) -> None:
    path = tmp_path / "p.parquet"
    path.write_bytes(b"nope")
    with pytest.raises(InputError, match=r"p\.parquet: cannot summarize output shard"):
        summarize_output_shard(path, input=InputIdentity("x", 0, 0, ""))


def test_bad_shards_round_trip_and_leave_when_committed(tmp_path: Path) -> None:
    manifest = Manifest.create(tmp_path, FINGERPRINT, job_time=JOB_TIME)
    bad = BadShard(InputIdentity("/data/part-1.parquet", 10, 3, "beef"), "reading failed after row 2")
    manifest.mark_bad("part-1.parquet", bad)
    loaded = Manifest.load(tmp_path)
    assert loaded is not None
    assert loaded.bad_shards() == {"part-1.parquet": bad}
    loaded.mark_committed("part-1.parquet", _record(input_path="/data/part-1.parquet"))
    reloaded = Manifest.load(tmp_path)
    assert reloaded is not None
    assert reloaded.bad_shards() == {}
    assert list(reloaded.committed()) == ["part-1.parquet"]
