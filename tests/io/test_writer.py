"""Output shards appear whole at commit or not at all; leftovers are cleaned."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.io import InputError, OutputShardWriter, check_output_dir, clean_temp_files

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("output", pa.string())])


def _batch(ids: list[int]) -> pa.RecordBatch:
    return pa.record_batch([pa.array(ids, pa.int64()), [f"o{i}" for i in ids]], schema=SCHEMA)


def test_commit_is_atomic(tmp_path: Path) -> None:
    writer = OutputShardWriter(tmp_path, "part-0.parquet", SCHEMA)
    temp = writer.temp_path
    assert temp.parent == tmp_path
    assert temp.name.startswith(f".part-0.parquet.tmp-{os.getpid()}-")
    writer.write(_batch([0, 1]))
    writer.write(_batch([2]))
    assert writer.num_rows == 3
    assert os.listdir(tmp_path) == [temp.name]  # nothing under the final name yet
    final = writer.commit()
    assert final == tmp_path / "part-0.parquet"
    assert os.listdir(tmp_path) == ["part-0.parquet"]
    table = pq.read_table(final)
    assert table.schema.equals(SCHEMA)
    assert table.column("id").to_pylist() == [0, 1, 2]
    assert pq.ParquetFile(final).metadata.row_group(0).column(0).compression == "ZSTD"
    with pytest.raises(ValueError, match="already committed"):
        writer.write(_batch([3]))
    writer.abort()  # a no-op after commit
    assert final.exists()


def test_abort_removes_temp_and_is_idempotent(tmp_path: Path) -> None:
    writer = OutputShardWriter(tmp_path, "p.parquet", SCHEMA)
    writer.write(_batch([0]))
    writer.abort()
    writer.abort()
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="aborted"):
        writer.commit()


def test_context_manager_aborts_on_exception(tmp_path: Path) -> None:
    with (
        pytest.raises(RuntimeError, match="engine died"),
        OutputShardWriter(tmp_path, "p.parquet", SCHEMA) as writer,
    ):
        writer.write(_batch([0]))
        raise RuntimeError("engine died")
    assert os.listdir(tmp_path) == []
    with OutputShardWriter(tmp_path, "p.parquet", SCHEMA) as writer:
        writer.write(_batch([0]))
        writer.commit()
    assert os.listdir(tmp_path) == ["p.parquet"]


def test_commit_replaces_an_existing_shard(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_batches([_batch([9, 9])]), tmp_path / "p.parquet")
    with OutputShardWriter(tmp_path, "p.parquet", SCHEMA) as writer:
        writer.write(_batch([1]))
        writer.commit()
    assert pq.read_table(tmp_path / "p.parquet").column("id").to_pylist() == [1]


def test_schema_mismatch_and_bad_names(tmp_path: Path) -> None:
    with OutputShardWriter(tmp_path, "p.parquet", SCHEMA) as writer:
        other = pa.record_batch([pa.array([1], pa.int32())], names=["id"])
        with pytest.raises(ValueError, match="batch schema differs"):
            writer.write(other)
    for name in ("", "sub/p.parquet", ".hidden.parquet"):
        with pytest.raises(ValueError, match="plain file name"):
            OutputShardWriter(tmp_path, name, SCHEMA)
    assert os.listdir(tmp_path) == []


def test_clean_temp_files(tmp_path: Path) -> None:
    # a killed run leaves the temporary files of a shard and of the manifest
    abandoned = OutputShardWriter(tmp_path, "a.parquet", SCHEMA)
    abandoned.write(_batch([0]))
    (tmp_path / ".manifest.json.tmp-123-abcd").write_text("{")
    (tmp_path / "b.parquet").write_bytes(b"committed")
    (tmp_path / ".keep").write_text("not ours")
    assert clean_temp_files(tmp_path) == 2
    assert sorted(os.listdir(tmp_path)) == [".keep", "b.parquet"]
    assert clean_temp_files(tmp_path) == 0
    assert clean_temp_files(tmp_path / "missing") == 0
    abandoned.abort()


def test_check_output_dir_creates_folder(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    check_output_dir(out)
    assert out.is_dir()
    assert os.listdir(out) == []  # the probe file is gone
    check_output_dir(out)  # an existing folder is fine


def test_check_output_dir_errors(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(InputError, match=f"output folder {blocker} exists and is not a folder"):
        check_output_dir(blocker)
    with pytest.raises(InputError, match=f"cannot create output folder {blocker}/out"):
        check_output_dir(blocker / "out")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_check_output_dir_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        with pytest.raises(InputError, match=f"output folder {locked} is not writable"):
            check_output_dir(locked)
    finally:
        locked.chmod(0o755)


def test_check_output_dir_probe_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # root can write into a read-only folder, so the failing probe is simulated here
    def refuse(self: Path, mode: str = "r") -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", refuse)
    with pytest.raises(
        InputError, match=f"output folder {tmp_path} is not writable: Permission denied"
    ):
        check_output_dir(tmp_path)


# --- durability order: fsync(file) -> rename -> fsync(folder) ----------------------------------


def _record_durability_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Patch os.fsync and os.replace to log ("fsync", path) and ("replace", "src -> dst")."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(("replace", f"{os.fspath(src)} -> {os.fspath(dst)}"))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return calls


def test_shard_commit_fsyncs_the_file_then_renames_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = pa.schema([("x", pa.int64())])
    writer = OutputShardWriter(tmp_path, "part-0.parquet", schema)
    writer.write(pa.record_batch([pa.array([1, 2])], schema=schema))
    temp = writer.temp_path
    calls = _record_durability_calls(monkeypatch)
    writer.commit()
    assert calls == [
        ("fsync", str(temp)),
        ("replace", f"{temp} -> {tmp_path / 'part-0.parquet'}"),
        ("fsync", str(tmp_path)),
    ]


def test_manifest_save_fsyncs_the_file_then_renames_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchgen.io import Manifest

    manifest = Manifest.create(tmp_path, {"seed": 0}, job_time="2026-01-01T00:00:00")
    calls = _record_durability_calls(monkeypatch)
    manifest.save()
    assert [kind for kind, _ in calls] == ["fsync", "replace", "fsync"]
    temp = calls[0][1]
    assert Path(temp).parent == tmp_path and Path(temp).name.startswith(".manifest.json.tmp-")
    assert calls[1] == ("replace", f"{temp} -> {tmp_path / 'manifest.json'}")
    assert calls[2] == ("fsync", str(tmp_path))
