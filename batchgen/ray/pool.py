"""The driver's pool of Ray actors (`executor: ray`): starting them against a deadline, watching
them (results, live progress, stalls), killing and replacing the failed ones, and noticing when
the cluster can no longer run one.

Owns: `WorkerPool`, the driver's record of each actor (`PoolWorker`), what an attempt at a
shard comes back as (`ShardOutcome`) and `ClusterLostError`.

Invariants:
- The driver never waits without a bound: every `ray.wait` / `ray.get` has a timeout, a
  worker that does not start within ``ray.worker_start_timeout_s`` and a worker holding a shard
  with no result and no progress for ``ray.worker_stall_timeout_s`` are declared dead.
- A failed actor (died, failed or timed out starting, stalled) is killed
  (``ray.kill(no_restart=True)``) and its pending task awaited (bounded) before its outcome is
  returned and before anything replaces it, so the driver touches its shard's files only after.
- Workers are replaced per slot (`ray.num_workers` slots): a worker that died running is
  replaced at the next `poll`; a slot whose workers failed to start ``ray.max_retries + 1``
  times in a row stays empty. Before any replacement the cluster is asked whether it can still
  run a worker (`node_shortage`); if not, `ClusterLostError` ends the run.
- Nothing here creates an actor or asks a task once the Ray connection is shut down (a
  ``.remote()`` call would silently start a new local Ray).

May import: ray (passed in as a module), batchgen.job, batchgen.io, batchgen.ray.worker and
batchgen.ray.cluster.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from batchgen.io import InputError
from batchgen.job.config import RayConfig
from batchgen.job.stages import JobError, ShardMeta
from batchgen.ray.cluster import node_shortage
from batchgen.ray.worker import ShardResult, ShardWorker, WorkerProgress

__all__ = ["ClusterLostError", "PoolWorker", "ShardOutcome", "WorkerPool"]

WorkerState = Literal["starting", "idle", "busy", "dead"]

# A ready ref's value is in the local object store or one fetch away.
_GET_TIMEOUT_S = 30.0
# How long a killed actor's pending task may take to end (an actor on a lost node may never
# answer; its files are then cleaned at the next start or by the driver's final sweep).
_KILL_WAIT_S = 10.0
_STOP_WAIT_S = 30.0
# How often a busy worker is asked for its live progress.
_PROGRESS_EVERY_S = 0.5


class ClusterLostError(JobError):
    """The Ray cluster can no longer run a worker; `reason` says why, for the user."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(slots=True)
class PoolWorker:
    """One actor and the driver's view of it. `since` is the clock time of its last sign of
    life (start asked, shard given, progress moved); `fate` says why it is dead."""

    number: int
    slot: int
    handle: Any
    since: float
    state: WorkerState = "starting"
    start_ref: Any = None
    host: str = ""
    pid: int = 0
    shard: ShardMeta | None = None
    ref: Any = None
    progress_ref: Any = None
    asked_at: float = 0.0
    live: WorkerProgress | None = None
    shards: int = 0
    rows: int = 0
    output_tokens: int = 0
    busy_s: float = 0.0
    fate: str = ""

    def figures(self) -> dict[str, Any]:
        return {
            "worker": self.number,
            "host": self.host,
            "pid": self.pid,
            "state": "died" if self.state == "dead" else "ok",
            "error": self.fate or None,
            "shards": self.shards,
            "rows": self.rows,
            "output_tokens": self.output_tokens,
            "busy_s": round(self.busy_s, 3),
            "output_tokens_per_s": self.output_tokens / self.busy_s if self.busy_s else 0.0,
        }


@dataclass(frozen=True, slots=True)
class ShardOutcome:
    """One finished attempt at a shard: `result` when the worker returned one, else `error` (a
    line for the user), `cause` (the worker's own exception, when it raised one) and `died`
    (the worker is gone, already killed: crashed, out of memory, stalled, its node lost)."""

    worker: PoolWorker
    shard: ShardMeta
    result: ShardResult | None = None
    error: str = ""
    cause: BaseException | None = None
    died: bool = False


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class WorkerPool:
    """The actors of one run. `clock` (seconds, monotonic) times starts and stalls."""

    def __init__(
        self,
        ray: ModuleType,
        config: RayConfig,
        actor_args: tuple[Any, ...],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`actor_args` are `ShardWorker`'s constructor arguments."""
        self._ray = ray
        self._config = config
        self._args = actor_args
        self._clock = clock
        self._actor_class = ray.remote(ShardWorker).options(
            num_cpus=config.num_cpus_per_worker,
            num_gpus=config.num_gpus_per_worker,
            max_concurrency=2,  # `progress` answers while `run_shard` runs
            max_restarts=0,
            max_task_retries=0,
        )
        self._workers: list[PoolWorker] = []
        self._failed_starts: Counter[int] = Counter()  # slot -> failed starts in a row
        self._to_replace: list[int] = []  # slots whose worker died, replaced at the next poll
        self.last_start_error = ""

    # --- views ----------------------------------------------------------------------------------

    def workers(self) -> list[PoolWorker]:
        return list(self._workers)

    def idle(self) -> list[PoolWorker]:
        return [w for w in self._workers if w.state == "idle"]

    def busy(self) -> list[PoolWorker]:
        return [w for w in self._workers if w.state == "busy"]

    def has_workers(self) -> bool:
        """Whether a worker is alive, starting or about to be replaced."""
        return bool(self._to_replace) or any(w.state != "dead" for w in self._workers)

    # --- commands -------------------------------------------------------------------------------

    def start(self, count: int) -> None:
        """Create `count` workers (slots 0..count-1); they start in the background."""
        for slot in range(count):
            self._spawn(slot)

    def submit(self, worker: PoolWorker, shard: ShardMeta) -> None:
        """Give an idle worker a shard."""
        assert worker.state == "idle", worker
        self._check_connected()
        worker.state, worker.shard, worker.live = "busy", shard, None
        worker.since = self._clock()
        worker.ref = worker.handle.run_shard.remote(shard)

    def poll(self, timeout_s: float) -> list[ShardOutcome]:
        """Replace the workers lost at the last poll, wait up to `timeout_s` for any start,
        result or progress, then enforce the start and stall deadlines. Returns the finished
        attempts. Raises InputError when a worker refuses to start for a reason every start
        would share (its model, engine settings or fingerprint), ClusterLostError when the
        cluster can no longer run a worker."""
        self._replace_lost()
        kinds: dict[Any, tuple[str, PoolWorker]] = {}
        for w in self._workers:
            for kind, ref in (("start", w.start_ref), ("shard", w.ref), ("progress", w.progress_ref)):
                if ref is not None:
                    kinds[ref] = (kind, w)
        outcomes: list[ShardOutcome] = []
        for ref in self._wait(list(kinds), timeout_s):
            kind, worker = kinds[ref]
            if worker.state == "dead":
                continue  # lost earlier in this batch: its refs were awaited and dropped
            if kind == "start":
                self._started(worker)
            elif kind == "shard":
                outcomes.append(self._finished(worker))
            else:
                self._progressed(worker)
        outcomes.extend(self._check_deadlines())
        self._ask_progress()
        return outcomes

    def stop(self) -> None:
        """Kill every worker and wait (bounded) for their tasks to end."""
        pending = [r for w in self._workers for r in (w.start_ref, w.ref) if r is not None]
        for worker in self._workers:
            self._kill(worker.handle)
        self._await_end(pending, _STOP_WAIT_S)

    # --- internals ------------------------------------------------------------------------------

    def _check_connected(self) -> None:
        if not self._ray.is_initialized():
            raise ClusterLostError("the connection to the Ray cluster was shut down")

    def _spawn(self, slot: int) -> None:
        self._check_connected()
        handle = self._actor_class.remote(*self._args)
        worker = PoolWorker(number=len(self._workers), slot=slot, handle=handle, since=self._clock())
        worker.start_ref = handle.start.remote()
        self._workers.append(worker)

    def _replace_lost(self) -> None:
        if not self._to_replace:
            return
        shortage = node_shortage(self._ray, self._config)
        if shortage is not None:
            raise ClusterLostError(shortage)
        slots, self._to_replace = self._to_replace, []
        for slot in slots:
            self._spawn(slot)

    def _wait(self, refs: list[Any], timeout_s: float) -> list[Any]:
        if not refs:
            return []
        ray = self._ray
        self._check_connected()
        try:
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        except (ray.exceptions.RayError, ValueError) as exc:
            reason = node_shortage(ray, self._config)
            raise ClusterLostError(reason or f"ray.wait failed ({type(exc).__name__}: {exc})") from exc
        return list(ready)

    def _get(self, ref: Any) -> Any:
        """The value of a ready ref. Raises what `ray.get` raises (RayTaskError: the task
        raised; another RayError: the actor or its object is gone, or the get timed out)."""
        try:
            return self._ray.get(ref, timeout=_GET_TIMEOUT_S)
        except SystemExit:
            # ray.get exits this way when ray.shutdown() runs meanwhile in another thread.
            if not self._ray.is_initialized():
                raise ClusterLostError("the connection to the Ray cluster was shut down") from None
            raise

    def _kill(self, handle: Any) -> None:
        ray = self._ray
        if not ray.is_initialized():
            return  # the session is gone, and its actors with it
        # A handle of an actor already gone (or of a finished session) has nothing to kill.
        with contextlib.suppress(ray.exceptions.RayError, ValueError):
            ray.kill(handle, no_restart=True)

    def _await_end(self, refs: list[Any], timeout_s: float) -> None:
        """Wait up to `timeout_s` for the tasks of killed actors to end (with an error)."""
        if not refs or not self._ray.is_initialized():
            return
        # The session may go away meanwhile: its actors are gone with it.
        with contextlib.suppress(self._ray.exceptions.RayError, ValueError):
            self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)

    def _lose(self, worker: PoolWorker, reason: str, *, failed_start: bool) -> None:
        """Kill `worker`, wait (bounded) for its pending tasks, and plan its slot's replacement
        unless the slot is out of starts."""
        pending = [r for r in (worker.start_ref, worker.ref, worker.progress_ref) if r is not None]
        worker.state, worker.fate = "dead", reason
        worker.start_ref = worker.ref = worker.progress_ref = None
        worker.shard = None
        self._kill(worker.handle)
        self._await_end(pending, _KILL_WAIT_S)
        if failed_start:
            self._failed_starts[worker.slot] += 1
            self.last_start_error = f"worker {worker.number}: {reason}"
        if self._failed_starts[worker.slot] <= self._config.max_retries:
            self._to_replace.append(worker.slot)

    def _started(self, worker: PoolWorker) -> None:
        ray = self._ray
        ref, worker.start_ref = worker.start_ref, None
        try:
            identity = self._get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            if isinstance(cause, InputError):
                # The model, the engine settings or the fingerprint on that node: the job's
                # setup is wrong there, and every start would fail alike.
                raise type(cause)(str(cause)) from exc
            self._lose(worker, f"its start failed: {type(cause).__name__}: {cause}", failed_start=True)
            return
        except ray.exceptions.RayError as exc:
            self._lose(worker, f"it died while starting: {_first_line(exc)}", failed_start=True)
            return
        worker.host, worker.pid = identity.host, identity.pid
        worker.state, worker.since = "idle", self._clock()
        self._failed_starts[worker.slot] = 0

    def _finished(self, worker: PoolWorker) -> ShardOutcome:
        ray = self._ray
        shard, ref = worker.shard, worker.ref
        assert shard is not None
        try:
            result: ShardResult = self._get(ref)
        except ray.exceptions.RayTaskError as exc:
            worker.state, worker.shard, worker.ref = "idle", None, None
            cause = exc.cause
            return ShardOutcome(worker, shard, error=f"{type(cause).__name__}: {cause}", cause=cause)
        except ray.exceptions.RayError as exc:
            self._lose(worker, f"it died: {_first_line(exc)}", failed_start=False)
            return ShardOutcome(worker, shard, error=f"worker {worker.number} died: {exc}", died=True)
        worker.state, worker.shard, worker.ref = "idle", None, None
        worker.since = self._clock()
        worker.shards += 1
        worker.rows += shard.num_rows
        worker.output_tokens += result.stats.output_tokens
        worker.busy_s += result.busy_s
        return ShardOutcome(worker, shard, result=result)

    def _progressed(self, worker: PoolWorker) -> None:
        ref, worker.progress_ref = worker.progress_ref, None
        try:
            live: WorkerProgress = self._get(ref)
        except self._ray.exceptions.RayError:
            return  # a dead worker shows through its shard's result or its stall deadline
        old = worker.live
        # The first answer on a shard is the baseline: it moved only if rows were written.
        moved = live.shard_rows > 0 if old is None else (
            (old.shard, old.shard_rows, old.output_tokens) != (live.shard, live.shard_rows, live.output_tokens)
        )
        if worker.state == "busy" and moved:
            worker.since = self._clock()
        worker.live = live

    def _check_deadlines(self) -> list[ShardOutcome]:
        now = self._clock()
        outcomes: list[ShardOutcome] = []
        start_s, stall_s = self._config.worker_start_timeout_s, self._config.worker_stall_timeout_s
        for worker in list(self._workers):
            if worker.state == "starting" and now - worker.since > start_s:
                reason = f"it did not start within ray.worker_start_timeout_s ({start_s:g} s)"
                self._lose(worker, reason, failed_start=True)
            elif worker.state == "busy" and now - worker.since > stall_s:
                shard = worker.shard
                assert shard is not None
                reason = f"no result and no progress for ray.worker_stall_timeout_s ({stall_s:g} s)"
                self._lose(worker, reason, failed_start=False)
                error = f"worker {worker.number} was declared dead: {reason}"
                outcomes.append(ShardOutcome(worker, shard, error=error, died=True))
        return outcomes

    def _ask_progress(self) -> None:
        now = self._clock()
        for worker in self.busy():
            if worker.progress_ref is None and now - worker.asked_at >= _PROGRESS_EVERY_S:
                worker.progress_ref = worker.handle.progress.remote()
                worker.asked_at = now
