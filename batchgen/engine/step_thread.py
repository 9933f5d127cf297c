"""One dedicated thread for an engine's steps.

On the CPU every torch op that runs in parallel starts an OpenMP region on the calling thread's
own libgomp thread pool, and libgomp throttles all its pools' spinning while they hold more threads
than the machine has CPUs (`batchgen.kernels.cpu_threads`). Steps taken from anyio's worker
threads, or from any thread besides the one that loaded the model, pay for that on every parallel
region. `StepThread` runs every step on one thread and frees the idle pool of the thread that
opens it (the one that loaded the model).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import TypeVar

from batchgen.kernels import release_openmp_threads

__all__ = ["StepThread"]

T = TypeVar("T")


class StepThread:
    """A context manager: `submit(fn)` runs fn on the engine's one thread; leaving the block
    waits for what was submitted and ends the thread."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def __enter__(self) -> StepThread:
        release_openmp_threads()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batchgen-engine")
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        if self._pool is None:
            raise RuntimeError("StepThread.submit outside its with block")
        return self._pool.submit(fn)
