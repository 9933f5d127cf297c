"""`executor: ray`: the job's driver hands input shards to a pool of Ray actors.

Owns: the dispatch of shards to workers (`run_ray_job`), retries of failed shards, the progress
bar over all workers and the job summary with per-worker figures.

Invariants:
- Planning is the local executor's (`planned_job`: same lock, manifest, fingerprint, resume, `--restart`,
  temporary-file clean-up, reconciliation of shards renamed but not recorded).
- The driver is the only writer of the manifest; a worker commits an output file, the driver
  records it. At most one worker holds a shard at a time.
- A failed attempt (the worker died: killed, out of memory, node lost; or an unexpected error)
  removes the shard's temporary files; if the shard's output file exists by then (renamed, not
  yet returned) it is recorded, never generated twice; otherwise it is queued again, up to
  `ray.max_retries` more attempts, on a fresh worker when the old one died. A shard out of
  attempts stops the job (JobError naming it); shards committed by then stay committed.

May import: ray (lazily, with a message when it is missing), batchgen.job, batchgen.io.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from tqdm.auto import tqdm

from batchgen.io import InputError, ShardRecord, write_json_atomic
from batchgen.job.config import JobConfig, RayConfig
from batchgen.job.files import reconcile_shard
from batchgen.job.run import JobPlan, planned_job
from batchgen.job.stages import JobError, PipelineStats, ShardMeta
from batchgen.job.summary import JobSummary, make_summary
from batchgen.ray.cluster import check_resources, connect, import_ray
from batchgen.ray.worker import ShardResult, ShardWorker, WorkerProgress

__all__ = ["import_ray", "run_ray_job"]

_POLL_S = 0.5


@dataclass(slots=True)
class _Worker:
    """One actor and the driver's view of it."""

    number: int
    handle: Any
    host: str = ""
    pid: int = 0
    shard: ShardMeta | None = None
    ref: Any = None
    shards: int = 0
    rows: int = 0
    output_tokens: int = 0
    busy_s: float = 0.0
    died: bool = False
    live: WorkerProgress | None = None

    def figures(self) -> dict[str, Any]:
        return {
            "worker": self.number,
            "host": self.host,
            "pid": self.pid,
            "state": "died" if self.died else "ok",
            "shards": self.shards,
            "rows": self.rows,
            "output_tokens": self.output_tokens,
            "busy_s": round(self.busy_s, 3),
            "output_tokens_per_s": self.output_tokens / self.busy_s if self.busy_s else 0.0,
        }


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
    """The pool of workers and the queue of shards of one run."""

    def __init__(
        self,
        ray: ModuleType,
        config: JobConfig,
        plan: JobPlan,
        setup: Callable[[], None] | None,
        use_tqdm: bool,
    ) -> None:
        self._ray = ray
        self._config = config
        self._plan = plan
        self._setup = setup
        self._queue = deque(plan.todo)
        self._attempts: Counter[str] = Counter()
        self._totals = _Totals()
        self._workers: list[_Worker] = []
        self._actor_class = ray.remote(ShardWorker).options(
            num_cpus=config.ray.num_cpus_per_worker,
            num_gpus=config.ray.num_gpus_per_worker,
            max_concurrency=2,  # `progress` answers while `run_shard` runs
            max_restarts=0,
            max_task_retries=0,
        )
        self._total_rows = sum(s.num_rows for s in plan.todo)
        self._bar = tqdm(
            total=self._total_rows, desc="rows", unit="row", disable=not use_tqdm, dynamic_ncols=True
        )
        self._done_rows = 0
        self._start = time.perf_counter()

    # --- workers -------------------------------------------------------------------------------

    def _new_worker(self) -> _Worker:
        plan = self._plan
        handle = self._actor_class.remote(
            self._config, str(plan.out_dir), plan.manifest.job_time, plan.fingerprint, plan.identities, self._setup
        )
        worker = _Worker(number=len(self._workers), handle=handle)
        self._workers.append(worker)
        return worker

    def _start_workers(self) -> None:
        count = min(self._config.ray.num_workers, len(self._plan.todo))
        started = [self._new_worker() for _ in range(count)]
        for worker in started:
            try:
                identity = self._ray.get(worker.handle.identity.remote())
            except self._ray.exceptions.RayError as exc:
                raise InputError(
                    f"{self._config.source}: a Ray worker could not start "
                    f"(model, engine or cluster setup): {exc}"
                ) from exc
            worker.host, worker.pid = str(identity["host"]), int(identity["pid"])

    def _replace(self, dead: _Worker) -> None:
        dead.died = True
        worker = self._new_worker()
        try:
            identity = self._ray.get(worker.handle.identity.remote())
            worker.host, worker.pid = str(identity["host"]), int(identity["pid"])
        except self._ray.exceptions.RayError:
            worker.died = True  # its first shard fails, and counts as an attempt

    def _live(self) -> list[_Worker]:
        return [w for w in self._workers if not w.died]

    def stop(self) -> None:
        """Kill every worker, wait for them and remove the temporary files they left."""
        refs = [w.ref for w in self._workers if w.ref is not None]
        for worker in self._workers:
            self._ray.kill(worker.handle, no_restart=True)
        if refs:
            self._ray.wait(refs, num_returns=len(refs), timeout=30)
        for worker in self._workers:
            if worker.shard is not None:
                self._clean_temp(worker.shard)
        self._bar.close()

    # --- shards --------------------------------------------------------------------------------

    def _clean_temp(self, shard: ShardMeta) -> None:
        for path in self._plan.out_dir.glob(f".{shard.name}.tmp-*"):
            path.unlink(missing_ok=True)

    def _submit(self, worker: _Worker, shard: ShardMeta) -> None:
        self._attempts[shard.name] += 1
        worker.shard = shard
        worker.live = None
        worker.ref = worker.handle.run_shard.remote(shard)

    def _committed(self, worker: _Worker, shard: ShardMeta, result: ShardResult) -> None:
        self._plan.manifest.mark_committed(shard.name, result.record)
        self._totals.add(result.stats)
        worker.shards += 1
        worker.rows += shard.num_rows
        worker.output_tokens += result.stats.output_tokens
        worker.busy_s += result.busy_s
        self._done_rows += shard.num_rows

    def _failed(self, worker: _Worker, shard: ShardMeta, error: str, *, died: bool) -> None:
        self._clean_temp(shard)
        if died:
            self._replace(worker)
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

    def _collect(self, worker: _Worker) -> None:
        ray = self._ray
        shard, ref = worker.shard, worker.ref
        assert shard is not None
        worker.shard = worker.ref = None
        try:
            result = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, JobError | InputError):
                # Deterministic (error rate, a changed input): another attempt would fail alike.
                raise type(cause)(f"{shard.name}: {cause}") from exc
            self._failed(worker, shard, f"{type(cause).__name__}: {cause}", died=False)
        except ray.exceptions.RayError as exc:
            self._failed(worker, shard, f"worker {worker.number} died: {exc}", died=True)
        else:
            self._committed(worker, shard, result)

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> PipelineStats:
        """Dispatch until every shard is committed. Raises JobError / InputError."""
        ray = self._ray
        self._start_workers()
        while True:
            for worker in self._live():
                if worker.shard is None and self._queue:
                    shard = self._queue.popleft()
                    if reconcile_shard(
                        self._plan.manifest, self._plan.out_dir, shard.name, self._plan.identities[shard.name]
                    ):
                        continue
                    self._submit(worker, shard)
            busy = {w.ref: w for w in self._workers if w.ref is not None}
            if not busy:
                if self._queue:
                    raise JobError(f"{len(self._queue)} shards left but no Ray worker is alive")
                break
            ready, _ = ray.wait(list(busy), num_returns=1, timeout=_POLL_S)
            if ready:
                ready, _ = ray.wait(list(busy), num_returns=len(busy), timeout=0)
            for ref in ready:
                self._collect(busy[ref])
            self._show_progress()
        self._bar.close()
        stats = self._totals.stats
        stats.wall_s = time.perf_counter() - self._start
        return stats

    def _show_progress(self) -> None:
        ray = self._ray
        asking = {w.handle.progress.remote(): w for w in self._workers if w.shard is not None}
        if asking:
            ready, _ = ray.wait(list(asking), num_returns=len(asking), timeout=0.2)
            for ref in ready:
                try:
                    asking[ref].live = ray.get(ref)
                except ray.exceptions.RayError:
                    continue  # a dead worker shows up when its shard's result is collected
        in_flight = sum(
            w.live.shard_rows
            for w in self._workers
            if w.shard is not None and w.live is not None and w.live.shard == w.shard.name
        )
        tokens = sum(max(w.output_tokens, w.live.output_tokens if w.live else 0) for w in self._workers)
        rates = [w.live.hit_rate for w in self._workers if w.live is not None]
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        hit = sum(rates) / len(rates) if rates else 0.0
        self._bar.n = min(self._total_rows, self._done_rows + in_flight)
        self._bar.set_postfix_str(
            f"out {tokens / elapsed:.1f} tok/s, hit {hit:.0%}, workers {len(self._live())}", refresh=False
        )
        self._bar.refresh()

    def worker_figures(self) -> list[dict[str, Any]]:
        return [w.figures() for w in self._workers]

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
            write_json_atomic(plan.out_dir / "summary.json", summary.data)
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
