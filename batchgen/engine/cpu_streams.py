"""Two streams for a CPU decode step at full batch: half of its rows on a second thread, each
half on one core.

On two cores a batch-256 decode step runs its projections at the FMA peak and its attention at
the memory's read bandwidth. As one stream on two threads, the phases alternate and both cores
wait on the same bound at the same time; as two streams of about 128 rows, each on its own core
with one OpenMP thread, one stream's attention overlaps the other's projections. Measured on the
2-core AMD EPYC (single-turn ShareGPT, 512 requests; one step's rows run both ways, 30
alternations, medians): batch 256 169.9 against 173.6 ms at 116 tokens of context a row, 184.0
against 196.2 at 176; batch 224 149.6 against 151.3; batch 192 and below, no gain or a loss
(each stream reads all of the weights: batch 64, 59.5 against 53.9). So `ModelRunner` splits
only decode steps of at least `SPLIT_MIN_ROWS` rows, and only where torch runs two threads.

A row's results are the same bits either way: every kernel computes a row apart from the others
(the projections' chains run in k order whatever the rows, attention per sequence, the greedy
screen per row). The streams overlap only because the kernels, batchgen's and torch's, release
the GIL while they run.

`TwoStreams` owns the second thread: it starts it, sets that thread's OpenMP count to 1 once,
and runs one callable there per step while the calling thread runs the other with its own count
set to 1 for the while. May import: torch, batchgen.kernels.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from batchgen.kernels import OpenMPThreads

__all__ = ["SPLIT_MIN_ROWS", "TwoStreams"]

# Decode rows from which a step runs as two streams (see the module docstring).
SPLIT_MIN_ROWS = 224

A = TypeVar("A")
B = TypeVar("B")


class TwoStreams:
    """A second thread for half of a step; `run(first, second)` runs them side by side."""

    def __init__(self) -> None:
        self._threads = OpenMPThreads()
        self._work: queue.SimpleQueue[Callable[[], object] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[bool, object]] = queue.SimpleQueue()
        self._ready = threading.Event()
        self._usable = False
        self._thread = threading.Thread(target=self._serve, name="batchgen-stream", daemon=True)
        self._thread.start()
        self._ready.wait()

    @property
    def usable(self) -> bool:
        """Whether each stream can run on one thread (a libgomp is loaded and follows the count)."""
        return self._usable

    def _serve(self) -> None:
        # torch sets a thread's OpenMP count on its first use there: let it, then set ours
        torch.get_num_threads()
        self._threads.set(1)
        self._usable = self._threads.available and torch.get_num_threads() == 1
        self._ready.set()
        with torch.inference_mode():
            while (job := self._work.get()) is not None:
                try:
                    self._done.put((True, job()))
                except BaseException as exc:  # re-raised on the calling thread
                    self._done.put((False, exc))

    def run(self, first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
        """`first()` on the calling thread and `second()` on the stream's, each on one OpenMP
        thread; returns both results. Waits for `second` even when `first` raises; an error of
        either is raised here."""
        self._work.put(second)
        before = torch.get_num_threads()
        self._threads.set(1)
        try:
            a = first()
        finally:
            self._threads.set(before)
            ok, b = self._done.get()
        if not ok:
            assert isinstance(b, BaseException)
            raise b
        return a, b  # type: ignore[return-value]

    def close(self) -> None:
        """End the second thread once it is idle, and wait for it to end (a daemon thread cut
        off inside torch at the interpreter's exit aborts the process)."""
        self._work.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join()
