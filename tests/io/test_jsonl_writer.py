"""A response file appears whole at commit or not at all: its lines go to a temporary file,
which is flushed and fsynced, then renamed onto the final name, then the folder is fsynced.

The order is checked by recording `os.fsync` and `os.replace` as `batchgen.io.jsonl_writer`
reaches them (one `os` module for it and for `fsync_path`); deliberately wrong commits run
through the same check, which must then fail.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.io import clean_temp_files, jsonl_writer
from batchgen.io.jsonl_writer import JsonlShardWriter
from batchgen.io.writer import fsync_path

LINES = [{"custom_id": "a", "n": 1}, {"custom_id": "b", "text": "é \u2028 ☃"}]
CONTENT = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in LINES).encode("utf-8")


def _record(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Patch the `os` that jsonl_writer calls: each fsync is recorded as ("fsync", kind,
    (device, inode), size in bytes at that moment), each replace as ("replace", src, dst)."""
    events: list[tuple[Any, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: Any) -> None:
        st_ = os.fstat(fd)
        kind = "dir" if stat.S_ISDIR(st_.st_mode) else "file"
        events.append(("fsync", kind, (st_.st_dev, st_.st_ino), st_.st_size if kind == "file" else None))
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append(("replace", Path(src), Path(dst)))
        real_replace(src, dst, **kwargs)

    monkeypatch.setattr(jsonl_writer.os, "fsync", fsync)
    monkeypatch.setattr(jsonl_writer.os, "replace", replace)
    return events


def _identity(path: Path) -> tuple[int, int]:
    st_ = path.stat()
    return st_.st_dev, st_.st_ino


def _assert_durable_commit(events: list[tuple[Any, ...]], out_dir: Path, temp: Path, final: Path) -> None:
    """Exactly: the temporary file fsynced holding every line, renamed onto the final name,
    then the folder fsynced; nothing else."""
    assert events == [
        ("fsync", "file", _identity(final), len(CONTENT)),  # final: the renamed temp, same inode
        ("replace", temp, final),
        ("fsync", "dir", _identity(out_dir), None),
    ]
    assert final.read_bytes() == CONTENT


def _commit_rename_first(self: JsonlShardWriter) -> Path:
    handle, self._handle = self._handle, None
    assert handle is not None
    handle.flush()
    os.replace(self._temp_path, self._final_path)
    os.fsync(handle.fileno())
    handle.close()
    fsync_path(self._final_path.parent)
    return Path(self._final_path)


def _commit_without_folder_fsync(self: JsonlShardWriter) -> Path:
    handle, self._handle = self._handle, None
    assert handle is not None
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    os.replace(self._temp_path, self._final_path)
    return Path(self._final_path)


def _commit_folder_fsync_first(self: JsonlShardWriter) -> Path:
    handle, self._handle = self._handle, None
    assert handle is not None
    handle.flush()
    os.fsync(handle.fileno())
    handle.close()
    fsync_path(self._final_path.parent)
    os.replace(self._temp_path, self._final_path)
    return Path(self._final_path)


def _commit_fsync_before_flush(self: JsonlShardWriter) -> Path:
    handle, self._handle = self._handle, None
    assert handle is not None
    os.fsync(handle.fileno())  # the lines are still in Python's buffer
    handle.close()
    os.replace(self._temp_path, self._final_path)
    fsync_path(self._final_path.parent)
    return Path(self._final_path)


def _commit_once(out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[Any, ...]], Path, Path]:
    writer = JsonlShardWriter(out_dir, "results.jsonl")
    writer.write(LINES[:1])
    writer.write(LINES[1:])
    temp = writer._temp_path
    events = _record(monkeypatch)
    final = writer.commit()
    monkeypatch.undo()
    return events, temp, final


def test_commit_fsyncs_the_file_then_renames_then_fsyncs_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events, temp, final = _commit_once(tmp_path, monkeypatch)
    assert final == tmp_path / "results.jsonl"
    _assert_durable_commit(events, tmp_path, temp, final)
    assert os.listdir(tmp_path) == ["results.jsonl"]


@pytest.mark.parametrize(
    "wrong_commit",
    [_commit_rename_first, _commit_without_folder_fsync, _commit_folder_fsync_first, _commit_fsync_before_flush],
)
def test_a_commit_in_another_order_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong_commit: Callable[[JsonlShardWriter], Path]
) -> None:
    monkeypatch.setattr(JsonlShardWriter, "commit", wrong_commit)
    events, temp, final = _commit_once(tmp_path, monkeypatch)
    assert final.read_bytes() == CONTENT  # the file is right; only the durability order is not
    with pytest.raises(AssertionError):
        _assert_durable_commit(events, tmp_path, temp, final)


def test_nothing_under_the_final_name_before_commit(tmp_path: Path) -> None:
    writer = JsonlShardWriter(tmp_path, "results.jsonl")
    writer.write(LINES)
    assert writer.num_lines == 2
    (temp,) = os.listdir(tmp_path)
    assert temp.startswith(f".results.jsonl.tmp-{os.getpid()}-")
    assert not (tmp_path / "results.jsonl").exists()
    # What a killed run leaves, `clean_temp_files` finds.
    assert clean_temp_files(tmp_path, ["results.jsonl"]) == 1
    assert os.listdir(tmp_path) == []
    writer.abort()  # closes the handle; the file is already gone


def test_abort_context_and_use_after_commit(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="engine died"), JsonlShardWriter(tmp_path, "r.jsonl") as writer:
        writer.write(LINES)
        raise RuntimeError("engine died")
    assert os.listdir(tmp_path) == []
    writer = JsonlShardWriter(tmp_path, "r.jsonl")
    writer.commit()
    assert (tmp_path / "r.jsonl").read_bytes() == b""
    with pytest.raises(ValueError, match="already committed"):
        writer.write(LINES)
    with pytest.raises(ValueError, match="already committed"):
        writer.commit()
    writer.abort()  # a no-op after commit
    assert os.listdir(tmp_path) == ["r.jsonl"]


def test_a_failed_rename_removes_the_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rename(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    writer = JsonlShardWriter(tmp_path, "r.jsonl")
    writer.write(LINES)
    monkeypatch.setattr(jsonl_writer.os, "replace", no_rename)
    with pytest.raises(OSError, match="No space left"):
        writer.commit()
    assert os.listdir(tmp_path) == []


def test_bad_values_and_names_are_refused(tmp_path: Path) -> None:
    writer = JsonlShardWriter(tmp_path, "r.jsonl")
    with pytest.raises(ValueError, match="JSON compliant"):
        writer.write([{"x": float("nan")}])
    assert writer.num_lines == 0
    writer.abort()
    for name in ("", ".hidden", "a/b.jsonl"):
        with pytest.raises(ValueError, match="plain file name"):
            JsonlShardWriter(tmp_path, name)
    assert os.listdir(tmp_path) == []


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@given(st.lists(st.lists(st.dictionaries(st.text(max_size=8), _JSON, max_size=4), max_size=4), max_size=4))
@settings(max_examples=60)
def test_any_lines_come_back_one_per_newline(batches: list[list[dict[str, Any]]]) -> None:
    """Whatever the strings hold (newlines, U+2028, any code point but surrogates), each mapping
    is one physical line, split on b"\\n" only, that parses back to it."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        writer = JsonlShardWriter(Path(folder), "r.jsonl")
        for batch in batches:
            writer.write(batch)
        final = writer.commit()
        data = final.read_bytes()
    expected = [line for batch in batches for line in batch]
    assert writer.num_lines == len(expected)
    assert data.count(b"\n") == len(expected) and (not data or data.endswith(b"\n"))
    assert [json.loads(raw) for raw in data.split(b"\n")[:-1]] == expected
