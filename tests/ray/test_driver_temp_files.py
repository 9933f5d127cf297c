"""`batchgen.ray.driver.shard_temp_files`: the temporary files a failed attempt leaves are found by
exact name, so cleaning up after shard ``a[1].parquet`` (or ``a*.parquet``, ``a?.parquet``) never
deletes the temporary file another shard is writing at that moment. Issue 20, defect 11 (the
clean-up globbed the shard name unescaped). No Ray needed."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.io.writer import new_temp_path
from batchgen.ray.driver import shard_temp_files

GLOBBY = ["a[1].parquet", "a1.parquet", "a*.parquet", "ab.parquet", "a?.parquet", "a.parquet", "a[!1].parquet"]


def _touch(path: Path) -> Path:
    path.write_bytes(b"partial")
    return path


def test_glob_characters_in_a_shard_name_match_only_themselves(tmp_path: Path) -> None:
    temps = {name: _touch(new_temp_path(tmp_path, name)) for name in GLOBBY}
    for name in GLOBBY:
        _touch(tmp_path / name)  # the final files are never temporary
    for name in GLOBBY:
        assert shard_temp_files(tmp_path, name) == [temps[name]], name
    # What the old clean-up did: Path.glob(f".{name}.tmp-*") took other shards' files too.
    assert temps["a1.parquet"] in tmp_path.glob(".a[1].parquet.tmp-*")
    assert temps["ab.parquet"] in tmp_path.glob(".a*.parquet.tmp-*")


def test_a_name_that_extends_another_is_not_its_temporary_file(tmp_path: Path) -> None:
    # Shard "x.parquet.tmp-1-ab.parquet" writes ".x.parquet.tmp-1-ab.parquet.tmp-PID-HEX": it
    # starts with ".x.parquet.tmp-", yet it is not a temporary file of shard "x.parquet".
    other = _touch(new_temp_path(tmp_path, "x.parquet.tmp-1-ab.parquet"))
    mine = _touch(new_temp_path(tmp_path, "x.parquet"))
    assert shard_temp_files(tmp_path, "x.parquet") == [mine]
    assert shard_temp_files(tmp_path, "x.parquet.tmp-1-ab.parquet") == [other]
    assert shard_temp_files(tmp_path / "missing", "x.parquet") == []


_NAMES = st.text(alphabet="ab1[]*?!.-_ ", min_size=1, max_size=8).map(lambda s: f"{s}.parquet")


@settings(max_examples=200)
@given(names=st.lists(_NAMES, min_size=1, max_size=5, unique=True), copies=st.integers(1, 2))
def test_each_shard_finds_exactly_its_own_temporary_files(names: list[str], copies: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        temps = {name: sorted(_touch(new_temp_path(out, name)) for _ in range(copies)) for name in names}
        for name in names:
            assert shard_temp_files(out, name) == temps[name], (name, sorted(p.name for p in out.iterdir()))
