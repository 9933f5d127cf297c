"""`on_bad_shard: fail | skip` for a shard whose row group is corrupt (found mid-run), and ids
repeated across shards counted in the summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.job.helpers import final_shards, read_outputs, temp_files, write_job
from tests.job.test_job_safety import job_data, run, write_shard
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(
        tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64
    )


def corrupt_third_row_group(path: Path) -> None:
    """Overwrite the prompt column's pages of row group 2: the footer stays readable, reading
    fails when the stream reaches that row group."""
    column = pq.ParquetFile(path).metadata.row_group(2).column(1)
    data = bytearray(path.read_bytes())
    start = column.data_page_offset
    data[start : start + column.total_compressed_size] = b"\xab" * column.total_compressed_size
    path.write_bytes(bytes(data))


def three_shards(tmp_path: Path, on_bad_shard: str, model: Path) -> Path:
    write_shard(tmp_path / "in" / "part-0.parquet", 0, 6)
    ids = list(range(100, 140))
    pq.write_table(
        pa.table({"id": pa.array(ids, pa.int64()), "prompt": [f"Prompt {i}" for i in ids]}),
        tmp_path / "in" / "part-1.parquet",
        row_group_size=10,
    )
    corrupt_third_row_group(tmp_path / "in" / "part-1.parquet")
    write_shard(tmp_path / "in" / "part-2.parquet", 200, 6)
    data: dict[str, Any] = job_data(model, on_bad_shard=on_bad_shard)
    data["input"]["batch_rows"] = 10
    return write_job(tmp_path / "job.yaml", data)


def test_a_corrupt_row_group_fails_the_job_by_default(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = three_shards(tmp_path, "fail", model_dir)
    rc, _, err = run(job, capsys)
    assert rc == 2, err
    assert "part-1.parquet" in err and "reading failed after row 20" in err
    assert "part-1.parquet" not in [p.name for p in final_shards(tmp_path / "out")]
    assert temp_files(tmp_path / "out") == []


def test_skip_records_the_bad_shard_and_goes_on(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = three_shards(tmp_path, "skip", model_dir)
    rc, out, err = run(job, capsys)
    assert rc == 0, err
    assert "bad shards (skipped)" in out and "part-1.parquet" in out
    out_dir = tmp_path / "out"
    assert [p.name for p in final_shards(out_dir)] == ["part-0.parquet", "part-2.parquet"]
    assert temp_files(out_dir) == []
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == ["part-0.parquet", "part-2.parquet"]
    bad = manifest["bad_shards"]["part-1.parquet"]
    assert "reading failed after row 20" in bad["error"]
    assert bad["input"]["path"] == str(tmp_path / "in" / "part-1.parquet")
    assert bad["input"]["num_rows"] == 40
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary["bad_shards"]) == ["part-1.parquet"]
    assert summary["shards"]["committed_this_run"] == 2

    # A re-run does not read the unchanged bad shard again, and still reports it.
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    summary = json.loads((out_dir / "summary.json").read_text())
    assert list(summary["bad_shards"]) == ["part-1.parquet"]
    assert summary["shards"] == {"committed_this_run": 0, "skipped": 2}
    assert summary["rows"]["total"] == 0

    # Repaired, it is generated and leaves the bad list.
    ids = list(range(100, 140))
    pq.write_table(
        pa.table({"id": pa.array(ids, pa.int64()), "prompt": [f"Prompt {i}" for i in ids]}),
        tmp_path / "in" / "part-1.parquet",
    )
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == ["part-0.parquet", "part-1.parquet", "part-2.parquet"]
    assert manifest["bad_shards"] == {}
    assert read_outputs(out_dir)["part-1.parquet"].num_rows == 40


def test_skip_covers_an_unreadable_footer(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shard(tmp_path / "in" / "part-0.parquet", 0, 6)
    (tmp_path / "in" / "part-1.parquet").write_bytes(b"not parquet at all")
    job = write_job(tmp_path / "job.yaml", job_data(model_dir, on_bad_shard="skip"))
    rc, _, err = run(job, capsys)
    assert rc == 0, err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert list(summary["bad_shards"]) == ["part-1.parquet"]
    assert [p.name for p in final_shards(tmp_path / "out")] == ["part-0.parquet"]


def test_ids_repeated_across_shards_are_counted_in_the_summary(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_shard(tmp_path / "in" / "part-0.parquet", 0, 6)
    write_shard(tmp_path / "in" / "part-1.parquet", 3, 6)  # ids 3, 4, 5 again
    job = write_job(tmp_path / "job.yaml", job_data(model_dir))
    rc, out, err = run(job, capsys)
    assert rc == 0, err
    assert "ids repeated across shards" in out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rows"]["duplicate_ids_across_shards"] == 3
    assert summary["rows"]["duplicate_id_check"] == {"ids_tracked": 9, "complete": True}
    assert summary["rows"]["by_status"] == {"ok": 12}  # kept: valid rows of their shards
    tables = read_outputs(tmp_path / "out")
    assert tables["part-1.parquet"].column("id").to_pylist() == [3, 4, 5, 6, 7, 8]
