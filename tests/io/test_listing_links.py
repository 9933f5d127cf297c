"""Symbolic links and other spellings of one file in input listings (issue 20, defects 4 and 8),
and the identity of a shard taken from the file being read (defect 6).

One rule everywhere inputs are listed: links are followed, a cycle, a target reached twice and a
broken link are refused by name; never a silent skip. "The same file" is the same device and
inode, so a bind mount or a hard link cannot make an output equal an input unnoticed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.io import (
    ColumnMap,
    InputChangedError,
    InputError,
    find_input_shards,
    inspect_shard,
    iter_shard_batches,
)


def _shard(path: Path, ids: list[int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ids, "prompt": [f"p{i}" for i in ids]}), path)
    return path


@pytest.fixture()
def partitioned(tmp_path: Path) -> Path:
    """data/date=1/part-0.parquet (a folder) and data/date=2 -> ../real/date=2 (a link)."""
    _shard(tmp_path / "data" / "date=1" / "part-0.parquet", [1, 2])
    _shard(tmp_path / "real" / "date=2" / "part-1.parquet", [3, 4])
    (tmp_path / "data" / "date=2").symlink_to(tmp_path / "real" / "date=2")
    return tmp_path


def test_a_symlinked_partition_is_read_from_the_folder_and_the_glob_alike(partitioned: Path) -> None:
    by_folder = find_input_shards("data", partitioned)
    # os.walk without followlinks left date=2 out, and the job reported success without it
    assert [s.name for s in by_folder] == ["date=1__part-0.parquet", "date=2__part-1.parquet"]
    assert [s.partitions for s in by_folder] == [(("date", "1"),), (("date", "2"),)]
    by_glob = find_input_shards("data/*/*.parquet", partitioned)
    assert [s.path for s in by_glob] == [s.path for s in by_folder]
    by_recursive_glob = find_input_shards("data/**/*.parquet", partitioned)
    assert [s.path for s in by_recursive_glob] == [s.path for s in by_folder]


def test_a_symlinked_file_is_read(tmp_path: Path) -> None:
    _shard(tmp_path / "elsewhere" / "b.parquet", [5])
    _shard(tmp_path / "in" / "a.parquet", [6])
    (tmp_path / "in" / "b.parquet").symlink_to(tmp_path / "elsewhere" / "b.parquet")
    assert [s.name for s in find_input_shards("in", tmp_path)] == ["a.parquet", "b.parquet"]
    assert [s.name for s in find_input_shards("in/*.parquet", tmp_path)] == ["a.parquet", "b.parquet"]


@pytest.mark.parametrize("spec", ["in", "in/**/*.parquet"])
def test_a_link_cycle_is_refused_by_name(tmp_path: Path, spec: str) -> None:
    _shard(tmp_path / "in" / "sub" / "a.parquet", [1])
    (tmp_path / "in" / "sub" / "loop").symlink_to(tmp_path / "in")
    with pytest.raises(InputError, match=r"loop is a symbolic link cycle"):
        find_input_shards(spec, tmp_path)


@pytest.mark.parametrize(
    ("spec", "message"),
    [("in", r"in/x is reached twice \(also as .*/in/y"), ("in/**/*.parquet", "are the same file"),
     ("in/*/*.parquet", "are the same file")],
)
def test_one_folder_reached_twice_is_refused(tmp_path: Path, spec: str, message: str) -> None:
    _shard(tmp_path / "real" / "a.parquet", [1])
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "x").symlink_to(tmp_path / "real")
    (tmp_path / "in" / "y").symlink_to(tmp_path / "real")
    with pytest.raises(InputError, match=message):
        find_input_shards(spec, tmp_path)


def test_a_hard_linked_input_is_refused(tmp_path: Path) -> None:
    _shard(tmp_path / "in" / "a.parquet", [1])
    os.link(tmp_path / "in" / "a.parquet", tmp_path / "in" / "b.parquet")
    with pytest.raises(InputError, match="are the same file"):
        find_input_shards("in", tmp_path)


@pytest.mark.parametrize("spec", ["in", "in/*", "in/*.parquet"])
def test_a_broken_link_is_refused_not_skipped(tmp_path: Path, spec: str) -> None:
    _shard(tmp_path / "in" / "a.parquet", [1])
    (tmp_path / "in" / "date=3").symlink_to(tmp_path / "missing")
    (tmp_path / "in" / "c.parquet").symlink_to(tmp_path / "missing.parquet")
    with pytest.raises(InputError, match="broken symbolic link"):
        find_input_shards(spec, tmp_path)


def test_hidden_names_stay_skipped_and_globs_keep_their_dot_rule(tmp_path: Path) -> None:
    _shard(tmp_path / "in" / "a.parquet", [1])
    _shard(tmp_path / "in" / "_SUCCESS" / "x.parquet", [2])
    _shard(tmp_path / "in" / ".hidden.parquet", [3])
    _shard(tmp_path / "in" / "_part.parquet", [4])
    assert [s.name for s in find_input_shards("in", tmp_path)] == ["a.parquet"]
    # a glob, like glob.glob, matches _ names and does not match dot names with a wildcard
    assert [s.name for s in find_input_shards("in/*.parquet", tmp_path)] == ["_part.parquet", "a.parquet"]
    assert [s.name for s in find_input_shards("in/.*.parquet", tmp_path)] == [".hidden.parquet"]


def test_a_base_folder_with_glob_characters_is_literal(tmp_path: Path) -> None:
    base = tmp_path / "odd[1]*"
    _shard(base / "in" / "a.parquet", [1])
    assert [s.name for s in find_input_shards("in/*.parquet", base)] == ["a.parquet"]


# --- the same file under another spelling (defect 8) -------------------------------------------

def test_an_output_folder_under_a_bind_mount_of_the_input_is_refused(tmp_path: Path) -> None:
    # realpath cannot see through a bind mount: only device and inode tell the two apart.
    # Run in a private mount namespace so that the mount dies with the process.
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare (util-linux) is needed for this test")
    _shard(tmp_path / "in" / "a.parquet", [1])
    (tmp_path / "mnt").mkdir()
    script = (
        "import sys; from pathlib import Path; "
        "from batchgen.io import InputError, check_output_outside_inputs; "
        f"root = Path({str(tmp_path)!r}); "
        "shard = root / 'in' / 'a.parquet'; "
        "checks = [(root / 'mnt' / 'out', 'in'), (root / 'mnt', 'in'), (root / 'mnt', 'in/*.parquet')]\n"
        "for out, spec in checks:\n"
        "    try:\n"
        "        check_output_outside_inputs(out, spec, root, [shard])\n"
        "    except InputError as exc:\n"
        "        print('refused', exc)\n"
        "    else:\n"
        "        print('accepted', out, spec)\n"
    )
    command = f"mount --bind {tmp_path / 'in'} {tmp_path / 'mnt'} && {sys.executable} -c \"$0\""
    for prefix in (["-m"], ["-rm"]):  # as root, else in a user namespace
        done = subprocess.run(
            [unshare, *prefix, "sh", "-c", command, script], capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0:
            break
    assert done.returncode == 0, f"could not bind-mount: {done.stderr}"
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.startswith("refused") for line in lines), lines


def test_an_output_folder_given_in_another_case_is_refused(tmp_path: Path) -> None:
    # What a case-insensitive file system does (macOS, Windows shares): IN and in are one folder.
    # Linux file systems here are case-sensitive, so the second spelling is a bind of the first.
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.fail("unshare (util-linux) is needed for this test")
    _shard(tmp_path / "in" / "a.parquet", [1])
    (tmp_path / "IN").mkdir()
    script = (
        "from pathlib import Path; from batchgen.io import InputError, check_output_outside_inputs; "
        f"root = Path({str(tmp_path)!r})\n"
        "try:\n"
        "    check_output_outside_inputs(root / 'IN', 'in', root, [root / 'in' / 'a.parquet'])\n"
        "except InputError:\n"
        "    print('refused')\n"
    )
    command = f"mount --bind {tmp_path / 'in'} {tmp_path / 'IN'} && {sys.executable} -c \"$0\""
    for prefix in (["-m"], ["-rm"]):
        done = subprocess.run([unshare, *prefix, "sh", "-c", command, script], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            break
    assert done.stdout.strip() == "refused", done.stderr


# --- identity and read from one open file (defect 6) -------------------------------------------

def test_a_shard_replaced_after_planning_is_refused_before_any_row(tmp_path: Path) -> None:
    path = _shard(tmp_path / "a.parquet", [1, 2, 3])
    planned = inspect_shard(path, ColumnMap()).identity()
    # the same row count, other data: before, its rows were written stamped with the old identity
    replacement = _shard(tmp_path / "b.parquet", [7, 8, 9])
    os.replace(replacement, path)
    with pytest.raises(InputChangedError, match="changed after the job was planned"):
        next(iter_shard_batches(path, ColumnMap(), 2, expected=planned))


def test_an_unchanged_shard_reads_with_its_identity_checked(tmp_path: Path) -> None:
    path = _shard(tmp_path / "a.parquet", [1, 2, 3])
    planned = inspect_shard(path, ColumnMap()).identity()
    batches = list(iter_shard_batches(path, ColumnMap(), 2, expected=planned))
    assert [b.num_rows for b in batches] == [2, 1]


def test_the_identity_is_read_from_the_open_file_even_if_the_path_is_replaced(tmp_path: Path) -> None:
    path = _shard(tmp_path / "a.parquet", [1, 2, 3])
    planned = inspect_shard(path, ColumnMap()).identity()
    batches = iter_shard_batches(path, ColumnMap(), 1, expected=planned)
    first = next(batches)  # the file is open and checked
    os.replace(_shard(tmp_path / "b.parquet", [7, 8, 9]), path)
    rest = list(batches)  # still the planned file's rows, through the open descriptor
    assert [b.column("id")[0].as_py() for b in [first, *rest]] == [1, 2, 3]
