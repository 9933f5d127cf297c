"""The Ray worker of `executor: ray`: one engine per actor, one input shard at a time.

Owns: `ShardWorker` (the actor's class; the driver wraps it with `ray.remote`), where a worker
runs (`WorkerIdentity`), what a shard returns to the driver (`ShardResult`) and the worker's
live progress (`WorkerProgress`).

Invariants:
- The constructor only stores the driver's plan; `start` (the driver's first call, awaited with
  a deadline) loads the model, checks that this worker computes the driver's job fingerprint
  (same batchgen version, model and tokenizer contents, job fields) and builds the engine. A
  worker that loaded another model or batchgen refuses to start (InputError naming its host and
  the differing keys), so no output is ever stamped with a fingerprint it was not made under.
- `run_shard` runs the local pipeline (read, prepare, prefix order, engine, write) over one
  shard and commits its output file with the same temporary file + fsync + rename as a local
  run. It never touches the manifest: the driver, its only writer, records the returned
  `ShardRecord` (or, for a shard found unreadable under ``on_bad_shard: skip``, the bad shard).
- Every read checks the input against the identity recorded at planning, from the same open
  file (`FileSource`, `ShardMeta.identity`): an input replaced or edited since then stops the
  job with `InputChangedError`, and the rows written always belong to that identity.
- `progress` may be called from another thread while `run_shard` runs (the actor is created
  with two threads); it reads plain counters written by the pipeline's progress callback.

May import: batchgen.job, batchgen.engine and batchgen.models (types), batchgen.io. Not ray
itself: the driver applies `ray.remote`, so this module imports without Ray.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from batchgen.engine.llm_engine import LLMEngine
from batchgen.io import InputError, InputIdentity, ShardRecord
from batchgen.job.config import JobConfig
from batchgen.job.files import FileSink, FileSource
from batchgen.job.pipeline import run_pipeline_sync
from batchgen.job.prepare import RowPreparer
from batchgen.job.run import build_job_engine, job_fingerprint, pipeline_options
from batchgen.job.setup import load_model
from batchgen.job.stages import JobError, PipelineStats, ShardMeta
from batchgen.models.checkpoint import Checkpoint

__all__ = ["ShardResult", "ShardWorker", "WorkerIdentity", "WorkerProgress", "fingerprint_changes"]


@dataclass(frozen=True, slots=True)
class WorkerIdentity:
    """Where a started worker runs."""

    host: str
    pid: int


@dataclass(frozen=True, slots=True)
class ShardResult:
    """A shard's outcome: its manifest record (None when its input turned out unreadable under
    ``on_bad_shard: skip``: the read error is then ``stats.bad_shards[name]``), the pipeline's
    figures and the seconds the worker spent on it (`busy_s`)."""

    record: ShardRecord | None
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


@dataclass(frozen=True, slots=True)
class _Loaded:
    checkpoint: Checkpoint
    engine: LLMEngine
    preparer: RowPreparer


def fingerprint_changes(want: Mapping[str, Any], got: Mapping[str, Any], path: str = "") -> list[str]:
    """One line per leaf that differs between the driver's fingerprint (`want`) and this
    worker's (`got`), by dotted path: ``"model.fingerprint: 'ab..' -> 'cd..'"``; empty when
    they are equal."""
    lines: list[str] = []
    for key in [*want, *(k for k in got if k not in want)]:
        sub = f"{path}.{key}" if path else str(key)
        old, new = want.get(key, "<missing>"), got.get(key, "<missing>")
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            lines.extend(fingerprint_changes(old, new, sub))
        elif old != new:
            lines.append(f"{sub}: {old!r} -> {new!r}")
    return lines


class ShardWorker:
    """Loads the job's model once (`start`); generates whole input shards on request."""

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
        name) are the driver's plan; `setup` runs first in `start`, in the worker's process (a
        test hook, or the user's logging setup). Does no work: `start` does."""
        self._config = config
        self._out_dir = Path(out_dir)
        self._job_time = job_time
        self._fingerprint = dict(fingerprint)
        self._identities = dict(identities)
        self._setup = setup
        self._loaded: _Loaded | None = None
        self._shard: str | None = None
        self._shard_rows = 0
        self._output_tokens = 0
        self._hit_rate = 0.0

    def start(self) -> WorkerIdentity:
        """Run `setup`, load the model, check the job fingerprint against the driver's, build
        the engine; returns where this worker runs. Raises InputError when the model or the
        engine settings are unusable here, or when this worker's fingerprint differs from the
        driver's (another model file or batchgen version at the same path on this node)."""
        if self._setup is not None:
            self._setup()
        identity = WorkerIdentity(socket.gethostname(), os.getpid())
        checkpoint = load_model(self._config)
        changes = fingerprint_changes(self._fingerprint, job_fingerprint(self._config, checkpoint))
        if changes:
            raise InputError(
                f"{self._config.source}: the Ray worker on host {identity.host} (pid {identity.pid}) "
                "does not compute the driver's job fingerprint, so its output would be stamped "
                "with the wrong one; it differs in:\n  "
                + "\n  ".join(changes)
                + "\ninstall the same batchgen version and the same model files at the same path "
                "on every node"
            )
        engine, preparer = build_job_engine(self._config, checkpoint, self._job_time)
        self._loaded = _Loaded(checkpoint, engine, preparer)
        return identity

    def progress(self) -> WorkerProgress:
        return WorkerProgress(self._shard, self._shard_rows, self._output_tokens, self._hit_rate)

    def _on_progress(self, num_rows: int, output_tokens: int, hit_rate: float) -> None:
        self._shard_rows += num_rows
        self._output_tokens = output_tokens
        self._hit_rate = hit_rate

    def run_shard(self, shard: ShardMeta) -> ShardResult:
        """Generate `shard` and commit its output file; under ``on_bad_shard: skip`` a shard
        whose input turns out unreadable is dropped and reported in the result's
        ``stats.bad_shards``. Raises JobError (error rate, `start` not done) and InputError
        (an input changed since planning, an unreadable input under ``on_bad_shard: fail``)
        like a local run; the temporary file is removed on any failure but a kill, and the
        engine is rebuilt (a failed run leaves requests in it)."""
        loaded = self._loaded
        if loaded is None:
            raise JobError(f"{shard.input_path}: the Ray worker was given a shard before it started")
        start = time.perf_counter()
        self._shard, self._shard_rows = shard.name, 0
        records: dict[str, ShardRecord] = {}
        sink = FileSink(self._out_dir, self._config, self._fingerprint, self._identities, records.__setitem__)
        options = replace(pipeline_options(self._config, use_tqdm=False), on_progress=self._on_progress)
        try:
            stats = run_pipeline_sync(
                loaded.engine, loaded.preparer, FileSource(self._config), sink, [shard], options
            )
        except BaseException:
            # A failed pipeline leaves requests in the engine and the shard's ids in the
            # preparer; the next shard (maybe this one again) needs both clean.
            engine, preparer = build_job_engine(self._config, loaded.checkpoint, self._job_time)
            self._loaded = _Loaded(loaded.checkpoint, engine, preparer)
            raise
        finally:
            self._shard = None
        busy_s = time.perf_counter() - start
        if shard.name in stats.bad_shards:
            return ShardResult(None, stats, busy_s)
        if shard.name not in records:
            raise JobError(f"{shard.input_path}: the pipeline ended without committing {shard.name}")
        return ShardResult(records[shard.name], stats, busy_s)
