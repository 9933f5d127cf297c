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
- ``identity``: what identifies an input shard (path, size, rows, footer hash);
- ``job_folder``: a job's folder and the reserved names of its side files (`JobFolder`);
- ``lock``: the exclusive lock of an output folder for a whole run;
- ``errors``: `InputError`, whose message is shown to users as it is.

Sees only Arrow record batches and files, never a sequence or a model. Blocking calls (all of
them) are meant to run in worker threads.

May import: the standard library, pyarrow and (lazily) polars. Never torch, never another
batchgen package.
"""

from __future__ import annotations

from .errors import InputChangedError, InputError, ShardReadError
from .identity import InputIdentity
from .job_folder import SIDE_FILE_NAMES, JobFolder, is_output_name
from .listing import FileKey, file_key
from .lock import LOCK_NAME, OutputLock
from .manifest import (
    MANIFEST_NAME,
    BadShard,
    Manifest,
    ShardRecord,
    fingerprint_digest,
    read_shard_metadata,
    shard_metadata,
    summarize_output_shard,
)
from .reader import (
    InputShard,
    ShardInfo,
    check_output_outside_inputs,
    check_unchanged,
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
    SCORE_COLUMNS,
    ColumnMap,
    EchoPrompt,
    OutputRow,
    output_schema,
    passthrough_fields,
    rows_to_batch,
)
from .writer import (
    REPORT_NAME,
    SUMMARY_NAME,
    TIMELINE_NAME,
    OutputShardWriter,
    check_output_dir,
    clean_temp_files,
    find_temp_files,
    fsync_path,
    write_bytes_atomic,
    write_json_atomic,
    write_parquet_atomic,
)

__all__ = [
    "FINISH_REASONS",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "OUTPUT_COLUMNS",
    "REPORT_NAME",
    "SCORE_COLUMNS",
    "SIDE_FILE_NAMES",
    "SUMMARY_NAME",
    "TIMELINE_NAME",
    "BadShard",
    "ColumnMap",
    "EchoPrompt",
    "FileKey",
    "InputChangedError",
    "InputError",
    "InputIdentity",
    "InputShard",
    "JobFolder",
    "Manifest",
    "OutputLock",
    "OutputRow",
    "OutputShardWriter",
    "ShardInfo",
    "ShardReadError",
    "ShardRecord",
    "check_output_dir",
    "check_output_outside_inputs",
    "check_unchanged",
    "clean_temp_files",
    "file_key",
    "find_input_shards",
    "find_temp_files",
    "fingerprint_digest",
    "fsync_path",
    "hive_partitions",
    "inspect_shard",
    "is_output_name",
    "iter_shard_batches",
    "list_input_shards",
    "output_schema",
    "passthrough_fields",
    "plain_type",
    "read_shard_metadata",
    "resolve_path",
    "rows_to_batch",
    "shard_metadata",
    "shard_name",
    "summarize_output_shard",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_parquet_atomic",
]
