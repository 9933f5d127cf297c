"""The Ray worker of `executor: ray`: one engine per actor, one input shard at a time.

Owns: `ShardWorker` (the actor's class; the driver wraps it with `ray.remote`), what a shard
returns to the driver (`ShardResult`) and the worker's live progress (`WorkerProgress`).

Invariants:
- The model is loaded once, in the constructor; `run_shard` runs the local pipeline (read,
  prepare, prefix order, engine, write) over one shard and commits its output file with the same
  temporary file + fsync + rename as a local run. It never touches the manifest: the driver,
  its only writer, records the returned `ShardRecord`.
- `progress` may be called from another thread while `run_shard` runs (the actor is created
  with two threads); it reads plain counters written by the pipeline's progress callback.

May import: batchgen.job, batchgen.io. Not ray itself: the driver applies `ray.remote`, so this
module imports without Ray.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batchgen.io import InputIdentity, ShardRecord
from batchgen.job.config import JobConfig
from batchgen.job.files import FileSink, FileSource
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.run import build_job_engine, pipeline_options
from batchgen.job.setup import load_model
from batchgen.job.stages import JobError, PipelineStats, ShardMeta

__all__ = ["ShardResult", "ShardWorker", "WorkerProgress"]


@dataclass(frozen=True, slots=True)
class ShardResult:
    """A committed shard: its manifest record, the pipeline's figures and the seconds the
    worker spent on it (`busy_s`)."""

    record: ShardRecord
    stats: PipelineStats
    busy_s: float


@dataclass(frozen=True, slots=True)
class WorkerProgress:
    """A worker's live figures: the shard it is on (None when idle), rows of that shard written
    so far, output tokens of its engine since it started, its prefix hit rate."""

    shard: str | None
    shard_rows: int
    output_tokens: int
    hit_rate: float


class ShardWorker:
    """Loads the job's model once; generates whole input shards on request."""

    def __init__(
        self,
        config: JobConfig,
        out_dir: str,
        job_time: str,
        fingerprint: Mapping[str, Any],
        identities: Mapping[str, InputIdentity],
        setup: Callable[[], None] | None = None,
    ) -> None:
        """`job_time` (the manifest's), `fingerprint` and `identities` (input identity by shard
        name) are the driver's plan. `setup` runs first, in the worker's process (a test hook,
        or the user's logging setup). Raises InputError when the model or the engine settings
        are unusable."""
        if setup is not None:
            setup()
        self._config = config
        self._out_dir = Path(out_dir)
        self._job_time = job_time
        self._fingerprint = dict(fingerprint)
        self._identities = dict(identities)
        self._checkpoint = load_model(config)
        self._engine, self._preparer = build_job_engine(config, self._checkpoint, job_time)
        self._shard: str | None = None
        self._shard_rows = 0
        self._output_tokens = 0
        self._hit_rate = 0.0

    def identity(self) -> dict[str, str | int]:
        """Where the worker runs: host name and process id."""
        return {"host": socket.gethostname(), "pid": os.getpid()}

    def progress(self) -> WorkerProgress:
        return WorkerProgress(self._shard, self._shard_rows, self._output_tokens, self._hit_rate)

    def _on_progress(self, num_rows: int, output_tokens: int, hit_rate: float) -> None:
        self._shard_rows += num_rows
        self._output_tokens = output_tokens
        self._hit_rate = hit_rate

    def run_shard(self, shard: ShardMeta) -> ShardResult:
        """Generate `shard` and commit its output file. Raises JobError (error rate, an input
        that changed since planning) like a local run; the temporary file is removed on any
        failure but a kill, and the engine is rebuilt (a failed run leaves requests in it)."""
        start = time.perf_counter()
        self._shard, self._shard_rows = shard.name, 0
        records: dict[str, ShardRecord] = {}
        sink = FileSink(self._out_dir, self._config, self._fingerprint, self._identities, records.__setitem__)
        options = replace(
            pipeline_options(self._config, use_tqdm=False), on_progress=self._on_progress
        )
        try:
            stats = run_pipeline_sync(
                self._engine, self._preparer, FileSource(self._config), sink, [shard], options
            )
        except BaseException:
            # A failed pipeline leaves requests in the engine and the shard's ids in the
            # preparer; the next shard (maybe this one again) needs both clean.
            self._engine, self._preparer = build_job_engine(self._config, self._checkpoint, self._job_time)
            raise
        finally:
            self._shard = None
        if shard.name not in records:
            raise JobError(f"{shard.input_path}: the pipeline ended without committing {shard.name}")
        return ShardResult(records[shard.name], stats, time.perf_counter() - start)
