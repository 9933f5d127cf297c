"""A job's file source and sink: input shards read as Arrow batches, output shards written as
files (temporary file, fsync, rename) that carry the configuration's digest and their input's
identity in their Parquet metadata.

Shared by the local executor (`batchgen.job.run`) and the Ray workers (`batchgen.ray`): the sink
hands each committed shard's record to a callback, so the manifest keeps one writer.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen.io import (
    InputIdentity,
    Manifest,
    OutputRow,
    OutputShardWriter,
    ShardRecord,
    iter_shard_batches,
    output_schema,
    rows_to_batch,
    shard_metadata,
    summarize_output_shard,
)
from batchgen.job.config import JobConfig
from batchgen.job.stages import JobError, ShardMeta, ShardStats

__all__ = ["FileSink", "FileSource", "reconcile_shard"]


class FileSource:
    """Reads a job's input shards (the configured columns, `input.batch_rows` at a time); a
    passthrough column named after a Hive partition key the file lacks gets the shard's
    partition value (`ShardMeta.partitions`). Each read checks the file against the identity
    recorded at planning (`ShardMeta.identity`), from the same open file."""

    def __init__(self, config: JobConfig) -> None:
        self._columns = config.io.columns
        self._batch_rows = config.io.batch_rows

    def iter_batches(self, shard: ShardMeta) -> Iterator[pa.RecordBatch]:
        batches: Iterator[pa.RecordBatch] = iter_shard_batches(
            Path(shard.input_path),
            self._columns,
            self._batch_rows,
            partitions=shard.partitions,
            expected=shard.identity,
        )
        return batches


class FileSink:
    """Output shards as files in `out_dir`. Each file carries the fingerprint's digest and its
    input's identity (`identities[shard name]`) in its Parquet metadata; each committed shard's
    record goes to `on_commit` (a local run records it in the manifest; a Ray worker returns it
    to the driver). An OSError (disk full, ...) becomes a JobError naming the file; the pipeline
    then aborts every uncommitted shard."""

    def __init__(
        self,
        out_dir: Path,
        config: JobConfig,
        fingerprint: Mapping[str, Any],
        identities: Mapping[str, InputIdentity],
        on_commit: Callable[[str, ShardRecord], None],
    ) -> None:
        self._out_dir = out_dir
        self._config = config
        self._fingerprint = fingerprint
        self._identities = identities
        self._on_commit = on_commit
        self._writers: dict[int, OutputShardWriter] = {}
        self._schemas: dict[int, pa.Schema] = {}

    def _writer(self, shard: ShardMeta) -> OutputShardWriter:
        writer = self._writers.get(shard.index)
        if writer is None:
            schema = output_schema(
                shard.id_type,
                shard.passthrough,
                with_token_ids=self._config.io.include_token_ids,
                with_logprobs=self._config.io.include_logprobs,
                is_score=self._config.task == "score",
            ).with_metadata(shard_metadata(self._fingerprint, self._identities[shard.name]))
            self._schemas[shard.index] = schema
            writer = OutputShardWriter(self._out_dir, shard.name, schema)
            self._writers[shard.index] = writer
        return writer

    def write(self, shard: ShardMeta, rows: Sequence[OutputRow]) -> None:
        try:
            writer = self._writer(shard)
            writer.write(rows_to_batch(rows, self._schemas[shard.index]))
        except OSError as exc:
            raise JobError(f"{self._out_dir / shard.name}: cannot write the output shard: {exc}") from exc

    def commit(self, shard: ShardMeta, stats: ShardStats) -> None:
        try:
            writer = self._writer(shard)
            path = writer.commit()
            del self._writers[shard.index]
            # The record comes from the committed file, exactly as a resumed run rebuilds it
            # for a shard whose manifest save was lost (ShardRecord counts over output rows).
            record = summarize_output_shard(path, input=self._identities[shard.name])
        except OSError as exc:
            raise JobError(f"{self._out_dir / shard.name}: cannot commit the output shard: {exc}") from exc
        self._on_commit(
            shard.name, dataclasses.replace(record, wall_s=round(time.perf_counter() - stats.started, 3))
        )

    def discard(self, shard: ShardMeta) -> None:
        writer = self._writers.pop(shard.index, None)
        if writer is not None:
            writer.abort()

    def abort(self) -> None:
        for writer in self._writers.values():
            writer.abort()
        self._writers.clear()


def reconcile_shard(manifest: Manifest, out_dir: Path, name: str, identity: InputIdentity) -> bool:
    """Record shard `name` if its output file exists but the manifest lacks it (renamed, then
    killed before the save); True when the file exists (the shard is done, never written twice)."""
    path = out_dir / name
    if not path.exists():
        return False
    if name not in manifest.committed():
        manifest.mark_committed(name, summarize_output_shard(path, input=identity))
    return True
