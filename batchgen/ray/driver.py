"""`executor: ray`: the job's driver hands input shards to a pool of Ray actors.

Owns: the dispatch of shards to workers (`run_ray_job`), retries of failed shards, the progress
bar over all workers, the job summary with per-worker figures, and which temporary files belong
to a shard (`shard_temp_files`). The actors themselves are `batchgen.ray.pool`'s.

Invariants:
- Planning is the local executor's (`planned_job`: same lock, manifest, fingerprint, resume, `--restart`,
  temporary-file clean-up, reconciliation of shards renamed but not recorded).
- The driver is the only writer of the manifest; a worker commits an output file, the driver
  records it. At most one worker holds a shard at a time.
- A failed attempt (the worker died: killed, out of memory, stalled, node lost; or an unexpected
  error) removes the shard's own temporary files (exact names: never another shard's) once its
  worker is killed; if the shard's output file exists by then (renamed, not yet returned) it is
  recorded, never generated twice; otherwise it is queued again, up to `ray.max_retries` more
  attempts, on a fresh worker when the old one died. A shard out of attempts stops the job
  (JobError naming it); shards committed by then stay committed.
- A shard found unreadable on its worker under ``on_bad_shard: skip`` is recorded as a bad
  shard in the manifest and the summary, as a local run does; under ``fail`` it stops the job.
- The run never hangs: when the cluster can no longer run a worker (nodes lost, connection
  shut down, no worker could start) it ends with one JobError saying how many shards are
  committed; every temporary file is removed once the workers are killed, and a rerun resumes.

May import: ray (lazily, with a message when it is missing), batchgen.job, batchgen.io.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from tqdm.auto import tqdm

from batchgen.io import (
    InputError,
    ShardRecord,
    clean_temp_files,
    find_temp_files,
    write_json_atomic,
)
from batchgen.job.config import JobConfig, RayConfig
from batchgen.job.files import reconcile_shard
from batchgen.job.run import JobPlan, planned_job
from batchgen.job.stages import JobError, PipelineStats, ShardMeta
from batchgen.job.summary import JobSummary, make_summary
from batchgen.ray.cluster import check_resources, connect, import_ray
from batchgen.ray.pool import ClusterLostError, ShardOutcome, WorkerPool
from batchgen.ray.worker import ShardResult

__all__ = ["import_ray", "run_ray_job", "shard_temp_files"]

_POLL_S = 0.5


def shard_temp_files(out_dir: Path, name: str) -> list[Path]:
    """The temporary files of output shard `name` in `out_dir` (``.{name}.tmp-{pid}-{hex}``,
    `batchgen.io.new_temp_path`), matched by exact name: glob characters in `name` (``[``,
    ``*``, ``?``) match themselves only, and another shard's name never matches."""
    found: list[Path] = find_temp_files(out_dir, [name])
    return found


@dataclass(slots=True)
class _Totals:
    stats: PipelineStats = field(default_factory=PipelineStats)
    retries: Counter[str] = field(default_factory=Counter)

    def add(self, part: PipelineStats) -> None:
        s = self.stats
        s.num_rows += part.num_rows
        s.num_output_rows += part.num_output_rows
        s.rows_by_status.update(part.rows_by_status)
        s.error_codes.update(part.error_codes)
        s.structured_outputs.update(part.structured_outputs)
        s.prompt_tokens += part.prompt_tokens
        s.cached_tokens += part.cached_tokens
        s.output_tokens += part.output_tokens
        s.ideal_prefill_tokens += part.ideal_prefill_tokens
        for key, value in part.engine.items():
            if key in ("num_kv_blocks", "peak_kv_blocks_used"):
                s.engine[key] = max(s.engine.get(key, 0), value)
            else:
                s.engine[key] = s.engine.get(key, 0) + value
        s.committed_shards.extend(part.committed_shards)
        s.bad_shards.update(part.bad_shards)

    def add_record(self, name: str, record: ShardRecord) -> None:
        """A shard found committed on disk after its worker failed (no pipeline figures)."""
        s = self.stats
        s.num_rows += record.num_input_rows
        s.num_output_rows += record.num_output_rows
        s.rows_by_status.update(record.rows_by_status)
        s.error_codes.update(record.error_codes)
        s.prompt_tokens += record.prompt_tokens
        s.cached_tokens += record.cached_tokens
        s.output_tokens += record.completion_tokens
        s.committed_shards.append(name)


class _Dispatcher:
    """The queue of shards of one run over a pool of workers."""

    def __init__(
        self,
        ray: ModuleType,
        config: JobConfig,
        plan: JobPlan,
        setup: Callable[[], None] | None,
        use_tqdm: bool,
    ) -> None:
        self._config = config
        self._plan = plan
        self._queue = deque(plan.todo)
        self._attempts: Counter[str] = Counter()
        self._totals = _Totals()
        self._num_shards = plan.skipped + len(plan.todo)
        self._pool = WorkerPool(
            ray,
            config.ray,
            (config, str(plan.out_dir), plan.manifest.job_time, plan.fingerprint, plan.identities, setup),
        )
        self._total_rows = sum(s.num_rows for s in plan.todo)
        self._bar = tqdm(
            total=self._total_rows, desc="rows", unit="row", disable=not use_tqdm, dynamic_ncols=True
        )
        self._done_rows = 0
        self._start = time.perf_counter()

    def stop(self) -> None:
        """Kill every worker, wait (bounded) for them, then remove every temporary file in the
        output folder: with the workers gone (and the folder locked) none is being written."""
        self._pool.stop()
        try:
            clean_temp_files(self._plan.out_dir)
        finally:
            self._bar.close()

    # --- shards --------------------------------------------------------------------------------

    def _committed(self, shard: ShardMeta, result: ShardResult) -> None:
        assert result.record is not None
        self._plan.manifest.mark_committed(shard.name, result.record)
        self._totals.add(result.stats)
        self._done_rows += shard.num_rows

    def _bad(self, shard: ShardMeta, result: ShardResult) -> None:
        """Its input turned out unreadable on the worker (``on_bad_shard: skip``)."""
        self._totals.add(result.stats)
        self._plan.record_bad_shards({shard.name: result.stats.bad_shards[shard.name]})
        self._done_rows += shard.num_rows

    def _failed(self, shard: ShardMeta, error: str) -> None:
        # The pool killed a dead worker before returning its outcome: nothing writes these.
        for path in shard_temp_files(self._plan.out_dir, shard.name):
            path.unlink(missing_ok=True)
        out_dir = self._plan.out_dir
        if reconcile_shard(self._plan.manifest, out_dir, shard.name, self._plan.identities[shard.name]):
            # The worker renamed the output and failed before returning: the file is whole.
            self._totals.add_record(shard.name, self._plan.manifest.committed()[shard.name])
            self._done_rows += shard.num_rows
            return
        attempts = self._attempts[shard.name]
        if attempts > self._config.ray.max_retries:
            raise JobError(
                f"{shard.input_path}: shard {shard.name} failed {attempts} times "
                f"(ray.max_retries: {self._config.ray.max_retries}); last error: {error}\n"
                f"{len(self._plan.manifest.committed())} shards are committed in {out_dir} and "
                "stay so; run the job again to resume"
            )
        self._totals.retries[shard.name] += 1
        self._queue.appendleft(shard)

    def _collect(self, outcome: ShardOutcome) -> None:
        shard, result, cause = outcome.shard, outcome.result, outcome.cause
        if result is not None:
            if result.record is None:
                self._bad(shard, result)
            else:
                self._committed(shard, result)
        elif isinstance(cause, JobError | InputError):
            # Deterministic (error rate, a changed or unreadable input): another attempt would
            # fail alike.
            raise type(cause)(f"{shard.name}: {cause}") from cause
        else:
            self._failed(shard, outcome.error)

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> PipelineStats:
        """Dispatch until every shard is committed (or recorded bad). Raises JobError /
        InputError; JobError saying how many shards are committed when the cluster can no
        longer run a worker."""
        try:
            self._run()
        except ClusterLostError as exc:
            committed = len(self._plan.manifest.committed())
            raise JobError(
                f"the Ray cluster can no longer run this job: {exc.reason}; {committed} of "
                f"{self._num_shards} shards are committed in {self._plan.out_dir} and stay so; "
                "run the job again to resume"
            ) from exc
        self._bar.close()
        stats = self._totals.stats
        stats.wall_s = time.perf_counter() - self._start
        return stats

    def _run(self) -> None:
        pool = self._pool
        pool.start(min(self._config.ray.num_workers, len(self._plan.todo)))
        while True:
            for worker in pool.idle():
                while self._queue:
                    shard = self._queue.popleft()
                    if not reconcile_shard(
                        self._plan.manifest, self._plan.out_dir, shard.name, self._plan.identities[shard.name]
                    ):
                        self._attempts[shard.name] += 1
                        pool.submit(worker, shard)
                        break
            if not self._queue and not pool.busy():
                return
            if not pool.has_workers():
                raise ClusterLostError(f"no Ray worker could be started ({pool.last_start_error})")
            errors: list[Exception] = []
            for outcome in pool.poll(_POLL_S):
                try:
                    self._collect(outcome)
                except (JobError, InputError) as exc:
                    errors.append(exc)  # the other outcomes are recorded first
            if errors:
                raise errors[0]
            self._show_progress()

    def _show_progress(self) -> None:
        workers = self._pool.workers()
        busy = [w for w in workers if w.state == "busy" and w.shard is not None]
        in_flight = sum(
            w.live.shard_rows for w in busy if w.live is not None and w.shard is not None and w.live.shard == w.shard.name
        )
        tokens = sum(max(w.output_tokens, w.live.output_tokens if w.live else 0) for w in workers)
        rates = [w.live.hit_rate for w in workers if w.live is not None]
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        hit = sum(rates) / len(rates) if rates else 0.0
        alive = sum(w.state in ("idle", "busy") for w in workers)
        self._bar.n = min(self._total_rows, self._done_rows + in_flight)
        self._bar.set_postfix_str(
            f"out {tokens / elapsed:.1f} tok/s, hit {hit:.0%}, workers {alive}", refresh=False
        )
        self._bar.refresh()

    def worker_figures(self) -> list[dict[str, Any]]:
        return [w.figures() for w in self._pool.workers()]

    def retries(self) -> dict[str, int]:
        return dict(sorted(self._totals.retries.items()))


def run_ray_job(
    config: JobConfig,
    *,
    restart: bool = False,
    use_tqdm: bool = True,
    worker_setup: Callable[[], None] | None = None,
) -> JobSummary:
    """Run the job over a Ray cluster (`config.ray`); writes the same output folder, manifest and
    `summary.json` as `run_job`, plus per-worker figures and retries under ``"ray"``.

    Joins the cluster already connected in this process, else `ray.address`. `worker_setup`
    runs first in each worker process (pickled; tests inject faults with it). Raises InputError
    (setup: no Ray, a bad input, model or cluster) and JobError (a shard out of attempts, the
    error rate) with a message for the user.
    """
    if (config.io.input_format, config.io.output_format) != ("parquet", "parquet"):
        raise InputError(
            f"{config.source}: executor: ray reads and writes Parquet only; OpenAI batch files "
            "(input.format / output.format: openai_jsonl) run with executor: local"
        )
    ray = import_ray(config.source)
    start = time.perf_counter()
    with planned_job(config, restart=restart) as plan:
        plan.release_weights()  # the workers load their own; the driver needs none
        connected = connect(ray, config)
        try:
            if plan.todo:
                check_resources(ray, config)
            dispatcher = _Dispatcher(ray, config, plan, worker_setup, use_tqdm)
            try:
                stats = dispatcher.run()
            finally:
                dispatcher.stop()
        finally:
            if connected:
                ray.shutdown()
        summary = make_summary(
            stats,
            time.perf_counter() - start,
            skipped=plan.skipped,
            bad_shards=plan.record_bad_shards(stats.bad_shards),
            duplicate_ids=0,
            ids_tracked=0,
            duplicates_checked=False,  # each worker sees only its own shards
        )
        summary.data["executor"] = "ray"
        summary.data["ray"] = _ray_figures(config.ray, dispatcher)
        try:
            write_json_atomic(plan.folder.summary, summary.data)
        except OSError as exc:
            raise JobError(f"output folder {plan.out_dir}: {exc}") from exc
    return summary


def _ray_figures(config: RayConfig, dispatcher: _Dispatcher) -> dict[str, Any]:
    retries = dispatcher.retries()
    return {
        "address": config.address,
        "num_workers": config.num_workers,
        "retries": {"total": sum(retries.values()), "by_shard": retries},
        "workers": dispatcher.worker_figures(),
    }
