"""A GGUF file's metadata and tensor list, read without its tensor data.

`gguf.GGUFReader` builds numpy views of every metadata item as it opens a file: the built-in
model's tokenizer (49,152 tokens and 48,900 merges) took about 5 s of a simulation's start on
this machine. A simulation needs only the metadata and the tensor names, so `GGUFHeader` reads
the same header with `struct` from a memory map of the file. It offers what the config and
tokenizer readers use of a `GGUFReader`: `fields[key].contents()` (the same Python values:
ints, floats, bools, strings, lists of them) and `tensors` (each with `name` and `shape`).

Format (GGUF versions 2 and 3, either byte order): magic ``GGUF``, version (u32), tensor count and
metadata count (u64), then each metadata item (key string, value type u32, value), then each
tensor's info (name string, dimension count u32, dimensions u64 each, type u32, offset u64). A
string is its byte length (u64) and UTF-8 bytes; an array is its item type (u32), item count
(u64) and items.

May import: the standard library only.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GGUFHeader", "HeaderField", "HeaderTensor"]

_MAGIC = b"GGUF"
_STRING, _ARRAY = 8, 9
# Value type -> struct code of one item (GGUF's numbering).
_SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


@dataclass(frozen=True, slots=True)
class HeaderField:
    """One metadata item: `contents()` is its value, as `gguf.ReaderField.contents()` gives it."""

    name: str
    value: Any

    def contents(self) -> Any:
        return self.value


@dataclass(frozen=True, slots=True)
class HeaderTensor:
    """One tensor's info: `shape` in the file's order of dimensions, `type` its GGML type number,
    `offset` from the start of the tensor data."""

    name: str
    shape: tuple[int, ...]
    type: int
    offset: int


class _Cursor:
    def __init__(self, buf: mmap.mmap, order: str) -> None:
        self.buf = buf
        self.pos = 0
        self.order = order
        self._u32 = struct.Struct(order + "I")
        self._u64 = struct.Struct(order + "Q")

    def u32(self) -> int:
        (value,) = self._u32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(value)

    def u64(self) -> int:
        (value,) = self._u64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(value)

    def string(self) -> str:
        return self.strings(1)[0]

    def strings(self, count: int) -> list[str]:
        buf, u64, out = self.buf, self._u64, []
        pos, size = self.pos, len(self.buf)
        for _ in range(count):
            (n,) = u64.unpack_from(buf, pos)
            pos += 8
            if pos + n > size:
                raise struct.error(f"a string of {n} bytes runs past the end of the file")
            out.append(buf[pos : pos + n].decode("utf-8"))
            pos += n
        self.pos = pos
        return out

    def items(self, value_type: int, count: int) -> list[Any]:
        code = _SCALAR_CODES.get(value_type)
        if code is None:
            raise ValueError(f"unknown metadata value type {value_type}")
        layout = struct.Struct(f"{self.order}{count}{code}")
        values = list(layout.unpack_from(self.buf, self.pos))
        self.pos += layout.size
        return values

    def value(self, value_type: int) -> Any:
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            item_type, count = self.u32(), self.u64()
            if item_type == _STRING:
                return self.strings(count)
            if item_type == _ARRAY:
                return [self.value(_ARRAY) for _ in range(count)]
            return self.items(item_type, count)
        return self.items(value_type, 1)[0]


class GGUFHeader:
    """The metadata (`fields`) and tensor infos (`tensors`) of the GGUF file at `path`.

    Raises ValueError naming `path` for a file that is not GGUF (version 2 or 3) or ends inside
    its header, OSError when it cannot be opened."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.fields: dict[str, HeaderField] = {}
        self.tensors: list[HeaderTensor] = []
        with open(self.path, "rb") as f:
            try:
                buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError as exc:  # an empty file cannot be mapped
                raise ValueError(f"{self.path}: not a GGUF file ({exc})") from exc
        try:
            self._read(buf)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise ValueError(f"{self.path}: not a readable GGUF file: {exc}") from exc
        finally:
            buf.close()

    def _read(self, buf: mmap.mmap) -> None:
        if buf[:4] != _MAGIC:
            raise ValueError("no GGUF magic at its start")
        (version,) = struct.unpack_from("<I", buf, 4)
        order = "<"
        if version & 0xFFFF == 0:  # written on a big-endian host
            order = ">"
            (version,) = struct.unpack_from(">I", buf, 4)
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2 or 3)")
        cursor = _Cursor(buf, order)
        cursor.pos = 8
        num_tensors, num_fields = cursor.u64(), cursor.u64()
        # The header's own numbers come first, under the names GGUFReader gives them.
        for key, value in (("GGUF.version", version), ("GGUF.tensor_count", num_tensors), ("GGUF.kv_count", num_fields)):
            self.fields[key] = HeaderField(key, value)
        for _ in range(num_fields):
            key = cursor.string()
            self.fields[key] = HeaderField(key, cursor.value(cursor.u32()))
        for _ in range(num_tensors):
            name = cursor.string()
            shape = tuple(cursor.u64() for _ in range(cursor.u32()))
            self.tensors.append(HeaderTensor(name, shape, cursor.u32(), cursor.u64()))
