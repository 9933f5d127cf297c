"""What a job's output folder says about its runs, read from its files only.

Reads ``summary.json`` (the last run), ``manifest.json`` (fingerprint, committed shards),
``timeline.parquet`` (every run's engine timeline) -- under a named output's names for
``run-batch`` (`JobFolder`) -- and, for error examples, the error rows of the committed output
shards (Parquet: a few columns, batch by batch; OpenAI response files: their error lines;
stopping once each code has its examples). Any file may be missing: a report of what exists is
still written. Only regular files are read (a FIFO or a link in a shard's place is passed over).

May import: batchgen.io, pyarrow.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from batchgen.io import JobFolder, Manifest, ShardRecord

__all__ = ["ErrorExample", "JobFiles", "load_job_files"]

_EXAMPLES_PER_CODE = 3
_MESSAGE_CHARS = 300


@dataclass(frozen=True, slots=True)
class ErrorExample:
    shard: str
    row_id: str
    sample_index: int
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class JobFiles:
    out_dir: Path
    summary: dict[str, Any] | None
    fingerprint: dict[str, Any] | None
    shards: dict[str, ShardRecord]
    timeline: pa.Table | None
    error_codes: dict[str, int] = field(default_factory=dict)
    error_examples: list[ErrorExample] = field(default_factory=list)


def load_job_files(out: Path | JobFolder) -> JobFiles:
    """Read the job folder (a plain folder path: a folder of shards). Raises
    FileNotFoundError when it is not a folder, ValueError when a file is there but unreadable
    (the message names it)."""
    job = out if isinstance(out, JobFolder) else JobFolder(out)
    out_dir = job.path
    if not out_dir.is_dir():
        raise FileNotFoundError(f"{out_dir} is not a folder")
    summary = None
    summary_path = job.summary
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{summary_path}: not JSON ({exc})") from exc
    manifest = Manifest.load(out_dir, name=job.manifest_name)
    shards = manifest.committed() if manifest is not None else {}
    timeline = None
    timeline_path = out_dir / job.timeline_name
    if timeline_path.is_file():
        try:
            timeline = pq.read_table(timeline_path)
        except pa.ArrowException as exc:
            raise ValueError(f"{timeline_path}: not a Parquet file ({exc})") from exc
    codes: dict[str, int] = {}
    for record in shards.values():
        for code, n in record.error_codes.items():
            codes[code] = codes.get(code, 0) + n
    return JobFiles(
        out_dir=out_dir,
        summary=summary,
        fingerprint=manifest.fingerprint if manifest is not None else None,
        shards=shards,
        timeline=timeline,
        error_codes=codes,
        error_examples=_error_examples(out_dir, sorted(shards), set(codes)),
    )


def _error_examples(out_dir: Path, shard_names: list[str], codes: set[str]) -> list[ErrorExample]:
    found: dict[str, list[ErrorExample]] = {}

    def done() -> bool:
        return all(len(found.get(c, [])) >= _EXAMPLES_PER_CODE for c in codes)

    def add(name: str, row_id: object, sample_index: int, error: object) -> None:
        err = error if isinstance(error, dict) else {}
        code = str(err.get("code") or "internal")
        bucket = found.setdefault(code, [])
        if len(bucket) < _EXAMPLES_PER_CODE:
            message = str(err.get("message") or "")
            if len(message) > _MESSAGE_CHARS:
                message = message[: _MESSAGE_CHARS - 1] + "…"
            bucket.append(ErrorExample(name, str(row_id), sample_index, code, message))

    for name in shard_names:
        if done():
            break
        path = out_dir / name
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
        except FileNotFoundError:
            continue
        if name.endswith(".jsonl"):
            _jsonl_errors(path, name, add, done)
        else:
            _parquet_errors(path, name, add, done)
    return [e for code in sorted(found) for e in found[code]]


_Add = Callable[[str, object, int, object], None]


def _parquet_errors(path: Path, name: str, add: _Add, done: Callable[[], bool]) -> None:
    with pq.ParquetFile(path) as f:
        if not {"id", "sample_index", "finish_reason", "error"} <= set(f.schema_arrow.names):
            return
        for batch in f.iter_batches(columns=["id", "sample_index", "finish_reason", "error"]):
            errors = batch.filter(pc.equal(batch.column("finish_reason"), "error"))
            for row in errors.to_pylist():
                add(name, row["id"], int(row["sample_index"]), row["error"])
            if done():
                return


def _jsonl_errors(path: Path, name: str, add: _Add, done: Callable[[], bool]) -> None:
    """The error lines of an OpenAI batch response file (``{id, custom_id, response, error}``)."""
    try:
        with path.open("rb") as handle:
            for raw in handle:
                if not raw.strip():
                    continue
                line = json.loads(raw)
                if isinstance(line, dict) and line.get("error") is not None:
                    add(name, line.get("custom_id"), 0, line["error"])
                    if done():
                        return
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable response file ({exc})") from exc
