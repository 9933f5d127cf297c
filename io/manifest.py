"""The job manifest: which output shards are committed, and under which configuration.

Owns: ``manifest.json`` in the output folder (`Manifest`), the per-shard record
(`ShardRecord`) and its recomputation from a committed output shard (`summarize_output_shard`).

Invariants:
- The file is replaced atomically (temporary file, fsync, ``os.replace``, folder fsync), so a
  reader sees the old or the new manifest, never a torn one.
- A shard is recorded only after its output file was committed; a shard committed by a run
  killed before the manifest save is found on disk and summarized again.
- The fingerprint is stored as JSON (tuples become lists); `diff_fingerprint` compares in that
  form, so a loaded manifest compares equal to the configuration that wrote it.

Layout::

    {"format": 1,
     "fingerprint": {...},
     "shards": {"part-0.parquet": {"input_path": ..., "num_input_rows": ..., ...}}}

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import InputError
from .writer import write_json_atomic

__all__ = ["MANIFEST_NAME", "Manifest", "ShardRecord", "summarize_output_shard"]

MANIFEST_NAME = "manifest.json"
_FORMAT = 1
_SUMMARY_BATCH_ROWS = 8192


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """Counts for one committed output shard.

    `rows_by_status` has the keys "ok" and "error"; `error_codes` counts error rows by code;
    token counts are sums over the shard's output rows; `wall_s` is the seconds the shard took
    (0.0 when recomputed from the file).
    """

    input_path: str
    num_input_rows: int
    num_output_rows: int
    rows_by_status: dict[str, int]
    error_codes: dict[str, int]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of all fields."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardRecord:
        """The inverse of `to_json`. Raises ValueError on a missing, unknown or mistyped field."""
        names = [f.name for f in fields(cls)]
        if set(data) != set(names):
            raise ValueError(f"shard record fields {sorted(data)}, expected {sorted(names)}")
        for name in (
            "num_input_rows",
            "num_output_rows",
            "prompt_tokens",
            "cached_tokens",
            "completion_tokens",
        ):
            if not isinstance(data[name], int) or isinstance(data[name], bool):
                raise ValueError(
                    f"shard record field {name!r}: expected an integer, got {data[name]!r}"
                )
        for name in ("rows_by_status", "error_codes"):
            counts = data[name]
            if not isinstance(counts, dict) or not all(
                isinstance(k, str) and isinstance(v, int) for k, v in counts.items()
            ):
                raise ValueError(
                    f"shard record field {name!r}: expected a mapping of counts, got {counts!r}"
                )
        if not isinstance(data["input_path"], str):
            raise ValueError(
                f"shard record field 'input_path': expected a string, got {data['input_path']!r}"
            )
        if not isinstance(data["wall_s"], int | float) or isinstance(data["wall_s"], bool):
            raise ValueError(
                f"shard record field 'wall_s': expected a number, got {data['wall_s']!r}"
            )
        return cls(
            input_path=data["input_path"],
            num_input_rows=data["num_input_rows"],
            num_output_rows=data["num_output_rows"],
            rows_by_status=dict(data["rows_by_status"]),
            error_codes=dict(data["error_codes"]),
            prompt_tokens=data["prompt_tokens"],
            cached_tokens=data["cached_tokens"],
            completion_tokens=data["completion_tokens"],
            wall_s=float(data["wall_s"]),
        )


def _to_json_value(value: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy in JSON form (tuples become lists). Raises ValueError if not JSON-able."""
    try:
        result: dict[str, Any] = json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"fingerprint is not JSON-able: {exc}") from exc
    return result


def _diff(old: Any, new: Any, path: str, lines: list[str]) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in [*old, *(k for k in new if k not in old)]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in new:
                lines.append(f"{sub}: removed (was {old[key]!r})")
            elif key not in old:
                lines.append(f"{sub}: added ({new[key]!r})")
            else:
                _diff(old[key], new[key], sub, lines)
    elif old != new:
        lines.append(f"{path}: {old!r} -> {new!r}")


class Manifest:
    """The manifest of one output folder; `mark_committed`, `reset` and `create` save it."""

    def __init__(
        self, out_dir: Path, fingerprint: Mapping[str, Any], shards: Mapping[str, ShardRecord]
    ) -> None:
        self._out_dir = out_dir
        self._fingerprint = _to_json_value(fingerprint)
        self._shards = dict(shards)

    @property
    def path(self) -> Path:
        return self._out_dir / MANIFEST_NAME

    @property
    def fingerprint(self) -> dict[str, Any]:
        """A copy of the stored fingerprint, in JSON form."""
        return _to_json_value(self._fingerprint)

    @classmethod
    def load(cls, out_dir: Path) -> Manifest | None:
        """The manifest in `out_dir`, or None if there is none. Raises InputError naming the
        file when it cannot be read or is not a manifest."""
        path = out_dir / MANIFEST_NAME
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read the manifest ({exc})") from exc
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("format") != _FORMAT:
                raise ValueError(f'expected an object with "format": {_FORMAT}')
            fingerprint, shards = data.get("fingerprint"), data.get("shards")
            if not isinstance(fingerprint, dict) or not isinstance(shards, dict):
                raise ValueError('expected "fingerprint" and "shards" objects')
            records = {name: ShardRecord.from_json(rec) for name, rec in shards.items()}
        except (ValueError, TypeError, AttributeError) as exc:
            raise InputError(
                f"{path}: not a valid batchgen manifest ({exc}); "
                "delete it or restart the job to regenerate every shard"
            ) from exc
        return cls(out_dir, fingerprint, records)

    @classmethod
    def create(cls, out_dir: Path, fingerprint: Mapping[str, Any]) -> Manifest:
        """A manifest with no committed shard, saved at once. Raises ValueError if the
        fingerprint is not JSON-able, OSError if it cannot be written."""
        manifest = cls(out_dir, fingerprint, {})
        manifest.save()
        return manifest

    def diff_fingerprint(self, other: Mapping[str, Any]) -> list[str]:
        """One line per leaf that differs between the stored fingerprint and `other`, by dotted
        path: ``"sampling.max_tokens: 128 -> 64"``, ``"x.y: added (1)"``,
        ``"x.z: removed (was 2)"``. Empty when they are equal."""
        lines: list[str] = []
        _diff(self._fingerprint, _to_json_value(other), "", lines)
        return lines

    def committed(self) -> dict[str, ShardRecord]:
        """The committed shards by output shard name (a copy)."""
        return dict(self._shards)

    def mark_committed(self, shard_name: str, record: ShardRecord) -> None:
        """Record a committed shard and save."""
        self._shards[shard_name] = record
        self.save()

    def save(self) -> None:
        """Replace ``manifest.json`` atomically and durably."""
        data = {
            "format": _FORMAT,
            "fingerprint": self._fingerprint,
            "shards": {name: rec.to_json() for name, rec in self._shards.items()},
        }
        write_json_atomic(self.path, data)


def summarize_output_shard(path: Path, *, input_path: str, num_input_rows: int) -> ShardRecord:
    """Recompute the record of a committed output shard from its ``usage`` and ``error``
    columns (streamed, bounded memory). `wall_s` is 0.0. Raises InputError naming the file
    when it is unreadable or lacks those columns."""
    num_rows = num_errors = prompt_tokens = cached_tokens = completion_tokens = 0
    codes: Counter[str] = Counter()
    try:
        with pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20) as parquet_file:
            batches = parquet_file.iter_batches(
                batch_size=_SUMMARY_BATCH_ROWS, columns=["usage", "error"], use_threads=False
            )
            for batch in batches:
                num_rows += batch.num_rows
                usage = batch.column(0)
                prompt_tokens += _sum(pc.struct_field(usage, "prompt_tokens"))
                cached_tokens += _sum(pc.struct_field(usage, "cached_tokens"))
                completion_tokens += _sum(pc.struct_field(usage, "completion_tokens"))
                error = batch.column(1)
                num_errors += len(error) - error.null_count
                if error.null_count < len(error):
                    present = pc.filter(error, pc.is_valid(error))
                    code_values = pc.struct_field(present, "code").to_pylist()
                    codes.update("unknown" if c is None else c for c in code_values)
    except (OSError, pa.ArrowException, KeyError) as exc:
        raise InputError(f"{path}: cannot summarize output shard ({exc})") from exc
    return ShardRecord(
        input_path=input_path,
        num_input_rows=num_input_rows,
        num_output_rows=num_rows,
        rows_by_status={"ok": num_rows - num_errors, "error": num_errors},
        error_codes=dict(sorted(codes.items())),
        prompt_tokens=prompt_tokens,
        cached_tokens=cached_tokens,
        completion_tokens=completion_tokens,
        wall_s=0.0,
    )


def _sum(values: pa.Array) -> int:
    total = pc.sum(values).as_py()
    return 0 if total is None else int(total)
