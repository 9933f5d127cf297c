"""Input shards: listing, footer-only schema checks with user-facing errors, batch streaming."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchgen.io import (
    ColumnMap,
    InputError,
    find_input_shards,
    inspect_shard,
    iter_shard_batches,
    list_input_shards,
)

MESSAGE = pa.struct([pa.field("role", pa.string()), pa.field("content", pa.string())])


def _write(path: Path, table: pa.Table, **kwargs: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, **kwargs)
    return path


def _prompts(num_rows: int, start: int = 0) -> pa.Table:
    ids = list(range(start, start + num_rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "prompt": [f"prompt {i}" for i in ids],
            "lang": ["en" if i % 2 else "fr" for i in ids],
            "unused": [float(i) for i in ids],
        }
    )


# --- list_input_shards ---------------------------------------------------------------------


def test_folder_lists_parquet_files_sorted_and_recursive(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in ("b.parquet", "a.parquet", "sub/c.parquet", "_tmp/x.parquet", ".git/y.parquet"):
        _write(data / name, _prompts(1))
    (data / "notes.txt").write_text("not a shard")
    (data / "_SUCCESS").write_text("")
    (data / ".a.parquet.tmp-1-ff").write_bytes(b"leftover")
    expected = [data / "a.parquet", data / "b.parquet", data / "sub/c.parquet"]
    assert list_input_shards("data", tmp_path) == expected
    assert list_input_shards(str(data), Path("/nonexistent")) == expected
    # the job's own output folder inside the input folder is not input
    assert list_input_shards("data", tmp_path, exclude=data / "sub") == expected[:2]
    names = [s.name for s in find_input_shards("data", tmp_path)]
    assert names == ["a.parquet", "b.parquet", "sub__c.parquet"]


def test_hive_partitions_read_recursively_with_their_values(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in ("date=2026-11-29/country=us/part-0.parquet", "date=2026-11-30/country=fr/part-0.parquet"):
        _write(data / name, _prompts(2))
    shards = find_input_shards("data", tmp_path)
    assert [s.name for s in shards] == [
        "date=2026-11-29__country=us__part-0.parquet",
        "date=2026-11-30__country=fr__part-0.parquet",
    ]
    assert shards[1].partitions == (("date", "2026-11-30"), ("country", "fr"))
    columns = ColumnMap(passthrough=("date", "country"))
    info = inspect_shard(shards[1].path, columns, name=shards[1].name, partitions=shards[1].partitions)
    assert info.name == shards[1].name
    assert info.passthrough == pa.schema([pa.field("date", pa.string()), pa.field("country", pa.string())])
    batches = list(iter_shard_batches(shards[1].path, columns, 10, partitions=shards[1].partitions))
    assert batches[0].column(3).to_pylist() == ["fr", "fr"]
    assert batches[0].schema.names == ["id", "prompt", "date", "country"]
    # a passthrough column that is neither in the file nor a partition is still an error
    with pytest.raises(InputError, match="no column 'region'"):
        inspect_shard(shards[1].path, ColumnMap(passthrough=("region",)), partitions=shards[1].partitions)


def test_glob_relative_to_base_dir_and_recursive(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for name in ("x/p1.parquet", "y/p0.parquet", "y/skip.txt"):
        _write(data / name, _prompts(1))
    assert list_input_shards("data/*/*.parquet", tmp_path) == [
        data / "x/p1.parquet",
        data / "y/p0.parquet",
    ]
    assert list_input_shards("data/**/p0.parquet", tmp_path) == [data / "y/p0.parquet"]
    assert list_input_shards("data/x/p1.parquet", tmp_path) == [data / "x/p1.parquet"]


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"input 'data/prompts' does not exist \(resolved to /"):
        list_input_shards("data/prompts", tmp_path)


def test_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "readme.txt").write_text("x")
    with pytest.raises(InputError, match=r"no Parquet files in input folder 'empty'"):
        list_input_shards("empty", tmp_path)


def test_glob_matching_nothing(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        list_input_shards("data/*.parquet", tmp_path)
    assert str(info.value) == (
        f"no Parquet files match 'data/*.parquet' (resolved to {tmp_path}/data/*.parquet)"
    )


def test_duplicate_shard_names(tmp_path: Path) -> None:
    _write(tmp_path / "a" / "part-0.parquet", _prompts(1))
    _write(tmp_path / "b" / "part-0.parquet", _prompts(1))
    with pytest.raises(InputError, match="share the file name 'part-0.parquet'"):
        list_input_shards("*/*.parquet", tmp_path)


# --- inspect_shard -------------------------------------------------------------------------


def test_inspect_reads_footer(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.parquet", _prompts(5))
    info = inspect_shard(path, ColumnMap(passthrough=("lang",)))
    assert info.path == path
    assert info.name == "p.parquet"
    assert info.num_rows == 5
    assert info.id_type == pa.int64()
    assert info.passthrough == pa.schema([pa.field("lang", pa.string())])


def test_corrupt_parquet(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    with pytest.raises(InputError, match=r"bad\.parquet: not a readable Parquet file"):
        inspect_shard(path, ColumnMap())


def test_missing_id_column_lists_existing_columns(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.parquet", _prompts(2).drop(["id"]))
    with pytest.raises(InputError) as info:
        inspect_shard(path, ColumnMap())
    assert str(info.value) == (
        f"{path}: no column 'id' (the id column); the file has columns: prompt, lang, unused"
    )


def test_missing_prompt_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.parquet", _prompts(2))
    with pytest.raises(InputError, match=r"p\.parquet: no column 'text' \(the prompt column\)"):
        inspect_shard(path, ColumnMap(prompt="text"))


def test_missing_passthrough_column(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.parquet", _prompts(2))
    with pytest.raises(InputError, match=r"no column 'country' \(the passthrough column\)"):
        inspect_shard(path, ColumnMap(passthrough=("country",)))


def test_prompt_of_wrong_type(tmp_path: Path) -> None:
    table = pa.table({"id": [1, 2], "prompt": pa.array([3, 4], pa.int64())})
    path = _write(tmp_path / "p.parquet", table)
    with pytest.raises(InputError) as info:
        inspect_shard(path, ColumnMap())
    assert str(info.value) == (
        f"{path}: column 'prompt' (the prompt column) has type int64; expected string"
    )


def test_id_of_wrong_type(tmp_path: Path) -> None:
    table = pa.table({"id": [1.5, 2.5], "prompt": ["a", "b"]})
    path = _write(tmp_path / "p.parquet", table)
    with pytest.raises(InputError, match="'id' .* has type double; expected an integer or string"):
        inspect_shard(path, ColumnMap())


def test_string_id_and_nulls_are_fine(tmp_path: Path) -> None:
    table = pa.table({"id": ["a", None], "prompt": [None, "b"]})
    path = _write(tmp_path / "p.parquet", table)
    assert inspect_shard(path, ColumnMap()).id_type == pa.string()


@pytest.mark.parametrize(
    ("column_type", "problem"),
    [
        (pa.string(), "is not a list"),
        (pa.list_(pa.string()), "holds string, not structs"),
        (pa.list_(pa.struct([pa.field("role", pa.string())])), "has no 'content' field"),
        (
            pa.list_(pa.struct([pa.field("role", pa.int8()), pa.field("content", pa.string())])),
            "has 'role' of type int8, not string",
        ),
    ],
)
def test_messages_of_wrong_shape(tmp_path: Path, column_type: pa.DataType, problem: str) -> None:
    table = pa.table({"id": pa.array([1], pa.int32()), "conv": pa.nulls(1, column_type)})
    path = _write(tmp_path / "chat.parquet", table)
    with pytest.raises(InputError) as info:
        inspect_shard(path, ColumnMap(prompt=None, messages="conv"))
    message = str(info.value)
    assert message.startswith(f"{path}: column 'conv' (the messages column) has type")
    assert problem in message
    assert message.endswith("expected a list of struct<role: string, content: string>")


def test_messages_of_right_shape(tmp_path: Path) -> None:
    chat_type = pa.list_(
        pa.struct([*MESSAGE, pa.field("name", pa.string())])  # extra fields are allowed
    )
    chats = [[{"role": "user", "content": "hi", "name": None}], None]
    table = pa.table({"id": [1, 2], "conv": pa.array(chats, chat_type)})
    path = _write(tmp_path / "chat.parquet", table)
    assert inspect_shard(path, ColumnMap(prompt=None, messages="conv")).num_rows == 2


def test_sampling_params_must_be_struct(tmp_path: Path) -> None:
    table = _prompts(2).append_column("sp", pa.array([1, 2]))
    path = _write(tmp_path / "p.parquet", table)
    with pytest.raises(InputError, match="'sp' .* expected a struct"):
        inspect_shard(path, ColumnMap(sampling_params="sp"))


# --- iter_shard_batches --------------------------------------------------------------------


def test_batches_in_order_and_of_batch_rows(tmp_path: Path) -> None:
    # row groups of 7 rows do not line up with batches of 5: batches still hold 5 rows
    path = _write(tmp_path / "p.parquet", _prompts(23), row_group_size=7)
    columns = ColumnMap(passthrough=("lang",))
    batches = list(iter_shard_batches(path, columns, batch_rows=5))
    assert [b.num_rows for b in batches] == [5, 5, 5, 5, 3]
    assert all(b.schema.names == ["id", "prompt", "lang"] for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("id").to_pylist() == list(range(23))
    assert table.column("prompt").to_pylist() == [f"prompt {i}" for i in range(23)]


def test_batches_follow_required_column_order(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.parquet", _prompts(3))
    columns = ColumnMap(id="id", prompt="lang", passthrough=("unused", "prompt"))
    (batch,) = iter_shard_batches(path, columns, batch_rows=10)
    assert batch.schema.names == ["id", "lang", "unused", "prompt"]


def test_batches_of_an_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    path.write_bytes(b"garbage")
    stream = iter_shard_batches(path, ColumnMap(), batch_rows=4)
    with pytest.raises(InputError, match=r"bad\.parquet: not a readable Parquet file"):
        next(stream)


def test_closing_the_stream_early(tmp_path: Path) -> None:
    path = _write(tmp_path / "p.parquet", _prompts(10))
    stream = iter_shard_batches(path, ColumnMap(), batch_rows=3)
    assert next(stream).num_rows == 3
    stream.close()
    assert next(stream, None) is None


# --- shard identity and the output folder against the input set -------------------------------


def test_identity_changes_with_content_not_with_mtime(tmp_path: Path) -> None:


    columns = ColumnMap(id="id", prompt="prompt")
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["a", "b"]}), path)
    first = inspect_shard(path, columns)
    assert first.size == path.stat().st_size and len(first.footer_hash) == 64
    os.utime(path, (1, 1))
    assert inspect_shard(path, columns).identity() == first.identity()
    pq.write_table(pa.table({"id": [1, 2], "prompt": ["a", "c"]}), path)
    changed = inspect_shard(path, columns)
    assert changed.size == first.size  # same size, other content
    assert not changed.identity().matches(first.identity())


@pytest.mark.parametrize(
    ("spec", "out", "refused"),
    [
        ("in", "in", True),
        ("in", ".", True),  # contains the input folder
        ("in", "in/out", True),
        ("in", "out", False),
        ("in", "in-out", False),  # a name prefix is not a parent
        ("in/*.parquet", "in", True),
        ("in/*.parquet", "in/x", False),  # not read by a non-recursive glob
        ("*/*.parquet", "out", True),  # out/*.parquet would be read as input
        ("in/**/*.parquet", "in/sub/deeper", True),
        ("in/**/*.parquet", "in", True),
        ("in/*.parquet", "out", False),
        ("in/*.parquet", ".", True),  # contains the input shard
        ("in/a.parquet", "in", True),
        ("in/a.parquet", "in/out", False),
    ],
)
def test_output_outside_inputs(tmp_path: Path, spec: str, out: str, refused: bool) -> None:
    from batchgen.io import check_output_outside_inputs

    (tmp_path / "in" / "sub").mkdir(parents=True)
    shard = tmp_path / "in" / "a.parquet"
    pq.write_table(pa.table({"id": [1]}), shard)
    out_dir = Path(os.path.normpath(tmp_path / out))
    if refused:
        with pytest.raises(InputError, match="must lie outside the input set"):
            check_output_outside_inputs(out_dir, spec, tmp_path, [shard])
    else:
        check_output_outside_inputs(out_dir, spec, tmp_path, [shard])


def test_output_reached_through_a_symlink_is_refused(tmp_path: Path) -> None:
    from batchgen.io import check_output_outside_inputs

    (tmp_path / "in").mkdir()
    shard = tmp_path / "in" / "a.parquet"
    pq.write_table(pa.table({"id": [1]}), shard)
    (tmp_path / "link").symlink_to(tmp_path / "in")
    with pytest.raises(InputError, match="is the input"):
        check_output_outside_inputs(tmp_path / "link", "in", tmp_path, [shard])


def test_pandas_and_arrow_string_types_are_strings(tmp_path: Path) -> None:
    message = pa.struct([pa.field("role", pa.large_string()), pa.field("content", pa.large_string())])
    table = pa.table(
        {
            "id": pa.array(["a", "b", "a"], pa.string()).dictionary_encode(),
            "chat": pa.array([[{"role": "user", "content": "hi"}]] * 3, pa.large_list(message)),
            "ids": pa.array([[1, 2], [3], []], pa.list_(pa.int64())),
            "sp": pa.array([{"max_tokens": 4.0}] * 3, pa.struct([("max_tokens", pa.float64())])),
        }
    )
    path = _write(tmp_path / "p.parquet", table)
    columns = ColumnMap(prompt=None, messages="chat", sampling_params="sp")
    info = inspect_shard(path, columns, sampling_fields=("max_tokens", "n"))
    assert info.id_type == pa.string()  # the output id column is a plain string
    batch = next(iter_shard_batches(path, columns, 10))
    assert batch.column(0).type == pa.string() and batch.column(0).to_pylist() == ["a", "b", "a"]
    assert batch.column(1).to_pylist()[0] == [{"role": "user", "content": "hi"}]
    assert inspect_shard(path, ColumnMap(prompt=None, prompt_token_ids="ids")).num_rows == 3
    with pytest.raises(InputError, match=r"column 'chat' \(the prompt_token_ids column\) has type"):
        inspect_shard(path, ColumnMap(prompt=None, prompt_token_ids="chat"))
    with pytest.raises(InputError, match=r"a field 'max_tokens' that is not a sampling parameter"):
        inspect_shard(path, columns, sampling_fields=("n",))
