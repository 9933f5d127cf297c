"""`GGUFHeader` reads what `gguf.GGUFReader` reads of a GGUF file's metadata and tensor infos
(the same keys in the same order, equal values of equal Python types, the same tensor names,
shapes and types), without building numpy views of every item; the simulator reads models with
it. Checked on the packaged SmolLM2 file, on files written by `gguf.GGUFWriter` with every value
type in both byte orders, and on broken files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from batchgen.models.checkpoint import default_model_path
from batchgen.models.gguf_config import read_gguf_config
from batchgen.models.gguf_header import GGUFHeader
from batchgen.tokenizer.tokenizer import Tokenizer


def _assert_same(path: Path) -> None:
    header, reader = GGUFHeader(path), gguf.GGUFReader(path)
    assert list(header.fields) == list(reader.fields)
    for key, field in reader.fields.items():
        expected, got = field.contents(), header.fields[key].contents()
        assert got == expected, key
        assert type(got) is type(expected), key
        if isinstance(expected, list):
            assert [type(v) for v in got] == [type(v) for v in expected], key
    assert [(t.name, t.shape, t.type) for t in header.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type)) for t in reader.tensors
    ]


def test_the_packaged_model_reads_as_gguf_reads_it() -> None:
    _assert_same(default_model_path())


def test_the_config_and_tokenizer_built_from_it_are_the_same() -> None:
    path = default_model_path()
    header, reader = GGUFHeader(path), gguf.GGUFReader(path)
    assert read_gguf_config(header, path) == read_gguf_config(reader, path)
    text = "Hello, world! ¿Qué tal? 你好 \n\t<|im_start|>user"
    ours, theirs = Tokenizer.from_gguf(header), Tokenizer.from_gguf(reader)
    assert ours.encode(text) == theirs.encode(text)
    assert ours.eos_token_id == theirs.eos_token_id and ours.chat_template == theirs.chat_template


def _write_every_type(path: Path, endianess: gguf.GGUFEndian) -> Path:
    writer = gguf.GGUFWriter(path, "llama", endianess=endianess)
    writer.add_uint8("t.u8", 250)
    writer.add_int8("t.i8", -7)
    writer.add_uint16("t.u16", 65000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)
    writer.add_uint64("t.u64", 2**64 - 1)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float64("t.f64", 1e-300)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo ☃")
    writer.add_string("t.empty", "")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, 1.25, -3.0])
    writer.add_array("t.strs", ["a", "", "ü", "long " * 50])
    writer.add_array("t.bools", [True, False])
    writer.add_tensor("w.a", np.arange(12, dtype=np.float32).reshape(3, 4))
    writer.add_tensor("w.b", np.ones(5, dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG], ids=["little", "big"])
def test_every_value_type_in_either_byte_order(tmp_path: Path, endianess: gguf.GGUFEndian) -> None:
    path = _write_every_type(tmp_path / "t.gguf", endianess)
    _assert_same(path)
    fields = GGUFHeader(path).fields
    expected: dict[str, Any] = {"t.u64": 2**64 - 1, "t.i8": -7, "t.bool": True, "t.str": "héllo ☃", "t.strs": ["a", "", "ü", "long " * 50]}
    assert {k: fields[k].contents() for k in expected} == expected


def test_broken_files_are_value_errors_naming_the_file(tmp_path: Path) -> None:
    good = _write_every_type(tmp_path / "good.gguf", gguf.GGUFEndian.LITTLE).read_bytes()
    end = good.index(b"w.b") + 40  # past the last tensor info
    cases = {
        "empty": b"",
        "magic": b"GGUX" + good[4:],
        "version": good[:4] + (1).to_bytes(4, "little") + good[8:],
        **{f"cut{n}": good[:n] for n in (6, 20, 60, good.index(b"long"), end - 30)},
        "type": _bad_value_type(good),
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        with pytest.raises(ValueError, match=str(path)):
            GGUFHeader(path)


def _bad_value_type(good: bytes) -> bytes:
    """The file with the value type of its item `t.u8` set to 99 (no such type)."""
    at = good.index(b"t.u8") + len(b"t.u8")
    return good[:at] + (99).to_bytes(4, "little") + good[at + 4 :]
