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

- Each record holds the identity of the input shard it was made from (path, size, row count,
  footer hash); each output file carries the same identity and the fingerprint's digest in its
  Parquet key-value metadata (`shard_metadata`, `read_shard_metadata`), so a resume can refuse
  an output made from other data or another configuration, naming the shard.
- A shard whose output file carries no metadata of its own (an OpenAI response file) is recorded
  as pending, with its input's identity, before its file is renamed into place
  (`mark_pending`); a run killed between the rename and the record leaves a file that the next
  run adopts only when that pending identity matches today's input.
- Every shard name (committed, bad or pending) is one plain file name (`is_output_name`): a manifest
  with ``"../x"``, an absolute path or a side file's name is refused when loaded, so nothing
  that reads or deletes by these names can reach outside the output folder.
- ``job_time`` is the moment the job started (ISO 8601, local time, seconds); a resumed run
  reuses it (chat templates' ``strftime_now`` sees it), so prompts do not change with the date.

Layout::

    {"format": 2,
     "fingerprint": {...},
     "job_time": "2026-11-30T23:40:00",
     "shards": {"part-0.parquet": {"input_path": ..., "input_size": ..., "num_input_rows": ...,
                                   "input_footer_hash": ..., "num_output_rows": ..., ...}},
     "bad_shards": {"part-3.parquet": {"input_path": ..., "input_size": ..., ...,
                                       "error": "..."}},
     "pending": {"results.jsonl": {"path": ..., "size": ..., "num_rows": ..., "footer_hash": ...}}}

May import: the standard library and pyarrow. Nothing of batchgen, no torch.
"""

from __future__ import annotations

import hashlib
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
from .identity import InputIdentity
from .job_folder import is_output_name
from .writer import write_json_atomic

__all__ = [
    "MANIFEST_NAME",
    "BadShard",
    "InputIdentity",
    "Manifest",
    "ShardRecord",
    "fingerprint_digest",
    "read_shard_metadata",
    "shard_metadata",
    "summarize_output_shard",
]

MANIFEST_NAME = "manifest.json"
_FORMAT = 2
_META_FINGERPRINT = b"batchgen.fingerprint"
_META_INPUT = b"batchgen.input"


@dataclass(frozen=True, slots=True)
class BadShard:
    """An input shard skipped under ``on_bad_shard: skip``: its identity and the error."""

    input: InputIdentity
    error: str

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input.to_json(), "error": self.error}

    @classmethod
    def from_json(cls, data: Any) -> BadShard:
        if not isinstance(data, dict) or set(data) != {"input", "error"} or not isinstance(data["error"], str):
            raise ValueError(f"bad shard record: expected input and error, got {data!r}")
        return cls(InputIdentity.from_json(data["input"]), data["error"])


def fingerprint_digest(fingerprint: Mapping[str, Any]) -> str:
    """sha256 hex of the fingerprint's canonical JSON (sorted keys, tuples as lists)."""
    canonical = json.dumps(_to_json_value(fingerprint), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def shard_metadata(fingerprint: Mapping[str, Any], identity: InputIdentity) -> dict[bytes, bytes]:
    """The Parquet key-value metadata of an output shard: the fingerprint's digest and the
    input identity (JSON)."""
    return {
        _META_FINGERPRINT: fingerprint_digest(fingerprint).encode("ascii"),
        _META_INPUT: json.dumps(identity.to_json(), sort_keys=True).encode("utf-8"),
    }


def read_shard_metadata(path: Path) -> tuple[str, InputIdentity] | None:
    """(fingerprint digest, input identity) from an output shard's footer, or None when the
    file carries no batchgen metadata. Raises InputError naming the file when it is not a
    readable Parquet file or its metadata is malformed."""
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({exc})") from exc
    if _META_FINGERPRINT not in metadata or _META_INPUT not in metadata:
        return None
    try:
        identity = InputIdentity.from_json(json.loads(metadata[_META_INPUT]))
        digest = metadata[_META_FINGERPRINT].decode("ascii")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: malformed batchgen metadata ({exc})") from exc
    return digest, identity
_SUMMARY_BATCH_ROWS = 8192


@dataclass(frozen=True, slots=True)
class ShardRecord:
    """Counts for one committed output shard.

    `rows_by_status` has the keys "ok" and "error"; `error_codes` counts error rows by code;
    token counts are sums over the shard's output rows; `wall_s` is the seconds the shard took
    (0.0 when recomputed from the file).
    """

    input_path: str
    input_size: int
    input_footer_hash: str
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

    @property
    def input(self) -> InputIdentity:
        """The identity of the input shard the output was made from."""
        return InputIdentity(
            self.input_path, self.input_size, self.num_input_rows, self.input_footer_hash
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShardRecord:
        """The inverse of `to_json`. Raises ValueError on a missing, unknown or mistyped field."""
        names = [f.name for f in fields(cls)]
        if set(data) != set(names):
            raise ValueError(f"shard record fields {sorted(data)}, expected {sorted(names)}")
        for name in (
            "input_size",
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
        for name in ("input_path", "input_footer_hash"):
            if not isinstance(data[name], str):
                raise ValueError(
                    f"shard record field {name!r}: expected a string, got {data[name]!r}"
                )
        if not isinstance(data["wall_s"], int | float) or isinstance(data["wall_s"], bool):
            raise ValueError(
                f"shard record field 'wall_s': expected a number, got {data['wall_s']!r}"
            )
        return cls(
            input_path=data["input_path"],
            input_size=data["input_size"],
            input_footer_hash=data["input_footer_hash"],
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
    """The manifest of one output folder (the file `name` in it: `JobFolder.manifest_name`);
    `mark_committed`, `mark_bad` and `create` save it."""

    def __init__(
        self,
        out_dir: Path,
        fingerprint: Mapping[str, Any],
        shards: Mapping[str, ShardRecord],
        *,
        job_time: str,
        bad_shards: Mapping[str, BadShard] | None = None,
        name: str = MANIFEST_NAME,
        pending: Mapping[str, InputIdentity] | None = None,
    ) -> None:
        for shard in [*shards, *(bad_shards or {}), *(pending or {})]:
            if not is_output_name(shard):
                raise ValueError(f"shard name {shard!r} is not a plain output file name")
        self._out_dir = out_dir
        self._name = name
        self._fingerprint = _to_json_value(fingerprint)
        self._shards = dict(shards)
        self._job_time = job_time
        self._bad_shards = dict(bad_shards or {})
        self._pending = dict(pending or {})

    @property
    def path(self) -> Path:
        return self._out_dir / self._name

    @property
    def fingerprint(self) -> dict[str, Any]:
        """A copy of the stored fingerprint, in JSON form."""
        return _to_json_value(self._fingerprint)

    @property
    def job_time(self) -> str:
        """When the job started (ISO 8601, local time): what ``strftime_now`` sees."""
        return self._job_time

    @classmethod
    def load(cls, out_dir: Path, *, name: str = MANIFEST_NAME) -> Manifest | None:
        """The manifest `name` in `out_dir`, or None if there is none. Raises InputError naming
        the file when it cannot be read or is not a manifest (of this format), a shard name
        included (one plain file name each)."""
        path = out_dir / name
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
            job_time, bad = data.get("job_time"), data.get("bad_shards", {})
            pending_data = data.get("pending", {})
            if not isinstance(job_time, str) or not isinstance(bad, dict) or not isinstance(pending_data, dict):
                raise ValueError('expected a "job_time" string and "bad_shards" and "pending" objects')
            records = {shard: ShardRecord.from_json(rec) for shard, rec in shards.items()}
            bad_shards = {shard: BadShard.from_json(rec) for shard, rec in bad.items()}
            pending = {shard: InputIdentity.from_json(rec) for shard, rec in pending_data.items()}
            return cls(
                out_dir, fingerprint, records, job_time=job_time, bad_shards=bad_shards, name=name, pending=pending
            )
        except (ValueError, TypeError, AttributeError) as exc:
            raise InputError(
                f"{path}: not a valid batchgen manifest ({exc}); "
                "run with --restart to discard it and regenerate every shard"
            ) from exc

    @classmethod
    def create(
        cls, out_dir: Path, fingerprint: Mapping[str, Any], *, job_time: str, name: str = MANIFEST_NAME
    ) -> Manifest:
        """A manifest with no committed shard, saved at once. Raises ValueError if the
        fingerprint is not JSON-able, OSError if it cannot be written."""
        manifest = cls(out_dir, fingerprint, {}, job_time=job_time, name=name)
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

    def bad_shards(self) -> dict[str, BadShard]:
        """The input shards skipped as unreadable, by output shard name (a copy)."""
        return dict(self._bad_shards)

    def pending(self) -> dict[str, InputIdentity]:
        """Shards about to be renamed into place, with their input's identity (a copy)."""
        return dict(self._pending)

    def mark_pending(self, shard_name: str, identity: InputIdentity) -> None:
        """Record, before its output file is renamed into place, the input a shard is made from
        (for outputs that carry no metadata of their own), and save."""
        if not is_output_name(shard_name):
            raise ValueError(f"shard name {shard_name!r} is not a plain output file name")
        self._pending[shard_name] = identity
        self.save()

    def mark_committed(self, shard_name: str, record: ShardRecord) -> None:
        """Record a committed shard (no longer bad or pending, if it was) and save. Raises
        ValueError for a name that is not a plain output file name."""
        if not is_output_name(shard_name):
            raise ValueError(f"shard name {shard_name!r} is not a plain output file name")
        self._shards[shard_name] = record
        self._bad_shards.pop(shard_name, None)
        self._pending.pop(shard_name, None)
        self.save()

    def mark_bad(self, shard_name: str, bad: BadShard) -> None:
        """Record an input shard skipped as unreadable and save. Raises ValueError for a name
        that is not a plain output file name."""
        if not is_output_name(shard_name):
            raise ValueError(f"shard name {shard_name!r} is not a plain output file name")
        self._bad_shards[shard_name] = bad
        self.save()

    def save(self) -> None:
        """Replace ``manifest.json`` atomically and durably."""
        data: dict[str, Any] = {
            "format": _FORMAT,
            "fingerprint": self._fingerprint,
            "job_time": self._job_time,
            "shards": {name: rec.to_json() for name, rec in self._shards.items()},
            "bad_shards": {name: bad.to_json() for name, bad in self._bad_shards.items()},
        }
        if self._pending:
            data["pending"] = {name: identity.to_json() for name, identity in self._pending.items()}
        write_json_atomic(self.path, data)


def summarize_output_shard(path: Path, *, input: InputIdentity) -> ShardRecord:
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
        input_path=input.path,
        input_size=input.size,
        input_footer_hash=input.footer_hash,
        num_input_rows=input.num_rows,
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
