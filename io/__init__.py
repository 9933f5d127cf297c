"""batchgen.io: Parquet (and OpenAI batch JSONL) in and out, and the manifest that makes a job resumable.

Owns (one module each):
- ``schema``: the input column roles (`ColumnMap`) and the fixed output schema, identical for
  success and error rows (`output_schema`, `OutputRow`, `rows_to_batch`);
- ``listing``: finding input shards (folders recursively, Hive partitions, globs);
- ``reader``: footer-only schema checks, bounded-memory batch streams;
- ``openai_batch``: OpenAI Batch API request lines as Arrow rows (streamed);
- ``jsonl_writer``: response files written atomically, and their summary;
- ``writer``: output shards written to a temporary file and renamed whole on commit;
- ``manifest``: ``manifest.json``, the committed shards and the configuration fingerprint;
- ``errors``: `InputError`, whose message is shown to users as it is.

Sees only Arrow record batches and files, never a sequence or a model. Blocking calls (all of
them) are meant to run in worker threads.

May import: the standard library, pyarrow and (lazily) polars. Never torch, never another
batchgen package.
"""

from __future__ import annotations

from .errors import InputError
from .manifest import MANIFEST_NAME, Manifest, ShardRecord, summarize_output_shard
from .reader import (
    InputShard,
    ShardInfo,
    find_input_shards,
    hive_partitions,
    inspect_shard,
    iter_shard_batches,
    list_input_shards,
    plain_type,
    resolve_path,
    shard_name,
)
from .schema import (
    FINISH_REASONS,
    OUTPUT_COLUMNS,
    ColumnMap,
    OutputRow,
    output_schema,
    passthrough_fields,
    rows_to_batch,
)
from .writer import (
    OutputShardWriter,
    check_output_dir,
    clean_temp_files,
    fsync_path,
    write_json_atomic,
)

__all__ = [
    "FINISH_REASONS",
    "MANIFEST_NAME",
    "OUTPUT_COLUMNS",
    "ColumnMap",
    "InputError",
    "InputShard",
    "Manifest",
    "OutputRow",
    "OutputShardWriter",
    "ShardInfo",
    "ShardRecord",
    "check_output_dir",
    "clean_temp_files",
    "find_input_shards",
    "fsync_path",
    "hive_partitions",
    "inspect_shard",
    "iter_shard_batches",
    "list_input_shards",
    "output_schema",
    "passthrough_fields",
    "plain_type",
    "resolve_path",
    "rows_to_batch",
    "shard_name",
    "summarize_output_shard",
    "write_json_atomic",
]
