"""The prepare stage's work on one batch of input rows, in a worker thread or in a process of its own.

`prepare_batch` turns a record batch into PreparedRows with a `RowPreparer` (column values, the
reader's row errors, then the preparer). A run calls it in anyio's worker threads.

A simulation's engine steps are Python, and so is most of preparing rows (rendering chat
templates, building the rows): in one process the two take turns holding the GIL, and a
million-row simulation waits on that lock rather than on the cores. `PrepareProcess` holds copies
of the job's preparers in a child process, which takes each batch, prepares it and sends the rows
back, in order. The tokenizer runs there too. The rows are the same as in a thread: the child's
preparer is the parent's, pickled before the first batch (its id sets included), and the id sets
it ends with are copied back when the process closes, so a preparer used by several pipelines
(`batchgen simulate --workers`) keeps counting duplicate ids across them.

Nothing here imports torch: the child starts in about half a second.
"""

from __future__ import annotations

import collections
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

import pyarrow as pa

from batchgen.io import ColumnMap
from batchgen.job.prepare import PreparedRow, RowError, RowPreparer
from batchgen.job.stages import ShardMeta

__all__ = ["PrepareItem", "PrepareProcess", "ProcessPreparer", "prepare_batch"]


@dataclass(frozen=True, slots=True)
class PrepareItem:
    """A record batch of one shard, starting at row `first_row_idx` of it."""

    shard: ShardMeta
    first_row_idx: int
    batch: pa.RecordBatch

    @property
    def ends_shard(self) -> bool:
        return bool(self.first_row_idx + self.batch.num_rows == self.shard.num_rows)


def _column(batch: pa.RecordBatch, name: str | None, problems: list[RowError | None]) -> list[Any] | None:
    """The column's values; a value that cannot be read (pyarrow does not validate UTF-8 on
    read) is None, with a row error in `problems` at its position."""
    if name is None:
        return None
    array = batch.column(batch.schema.get_field_index(name))
    try:
        values: list[Any] = array.to_pylist()
    except UnicodeDecodeError:
        values = []
        for i in range(len(array)):
            try:
                values.append(array[i].as_py())
            except UnicodeDecodeError as exc:
                values.append(None)
                if problems[i] is None:
                    problems[i] = RowError("invalid_utf8", f"column '{name}' is not valid UTF-8 ({exc.reason})")
    return values


def _row_errors(batch: pa.RecordBatch, name: str | None, problems: list[RowError | None]) -> None:
    """Fold a reader's struct<code, message> error column into `problems`."""
    values = _column(batch, name, problems)
    for i, value in enumerate(values or ()):
        if value is not None and problems[i] is None:
            problems[i] = RowError(str(value.get("code") or "invalid_request"), str(value.get("message") or ""))


def prepare_batch(preparer: RowPreparer, cols: ColumnMap, item: PrepareItem) -> list[PreparedRow]:
    """The batch's rows, prepared (the preparer's id sets are updated)."""
    batch = item.batch
    problems: list[RowError | None] = [None] * batch.num_rows
    _row_errors(batch, cols.row_error, problems)
    ids = _column(batch, cols.id, problems) or []
    passthrough_cols = [_column(batch, name, problems) or [] for name in cols.passthrough]
    passthrough = [tuple(col[i] for col in passthrough_cols) for i in range(batch.num_rows)]
    return preparer.prepare(
        item.shard.index,
        item.first_row_idx,
        ids,
        _column(batch, cols.prompt, problems),
        _column(batch, cols.messages, problems),
        _column(batch, cols.sampling_params, problems),
        passthrough,
        token_ids=_column(batch, cols.prompt_token_ids, problems),
        row_errors=problems,
        completions=_column(batch, cols.completion, problems),
        echo=_column(batch, cols.echo, problems),
    )


def _child_main(read_fd: int, write_fd: int, niceness: int = 0) -> None:
    """The child's loop: requests from the parent, answers in the same order (see `PrepareProcess`);
    `niceness` is added to the child's before it starts."""
    # Ctrl-C reaches the whole process group; the parent decides what stops, and ends the child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if niceness:
        os.nice(niceness)
    requests, answers = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    preparers: list[RowPreparer] = []
    columns: ColumnMap | None = None
    while True:
        try:
            request = pickle.loads(requests.recv_bytes())
        except EOFError:  # the parent is gone
            return
        kind = request[0]
        try:
            if kind == "start":
                preparers, columns = request[1], request[2]
                answer: Any = None
            elif kind == "prepare":
                assert columns is not None, "the prepare process was not started"
                preparer, item = preparers[request[1]], request[2]
                answer = prepare_batch(preparer, columns, item)
                if item.ends_shard:
                    preparer.forget_shard(item.shard.index)
            elif kind == "ids":
                answer = [p.id_state() for p in preparers]
            else:  # "stop"
                return
            message = pickle.dumps(("ok", answer), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            try:
                message = pickle.dumps(("error", exc), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:
                text = "".join(traceback.format_exception(exc))
                message = pickle.dumps(("error", RuntimeError(f"in the prepare process:\n{text}")))
        answers.send_bytes(message)


def _settle(future: Future[Any], status: str, value: Any) -> None:
    try:
        if status == "ok":
            future.set_result(value)
        else:
            future.set_exception(value)
    except InvalidStateError:  # cancelled by its waiter
        pass


class PrepareProcess:
    """A child process that prepares batches with copies of `preparers` (see the module
    docstring). `submit(i, item)` prepares with the i-th; batches are prepared one at a time, in
    the order submitted, and each future holds its rows or the exception preparing raised. If
    the child dies, every waiting future fails with ChildProcessError. Use as a context manager:
    leaving it normally copies the child's id sets back into `preparers` (`close`); leaving it
    on an exception ends the child at once (`terminate`).

    The child is a plain `python -c` of this module, not a multiprocessing child, which would
    import the caller's main script again (and hang in a script without a main guard).

    `niceness` (added to the child's, 0 to 19) lowers the child's CPU priority below its
    parent's: where the cores are fewer than the threads that want them, the parent's work (a
    simulation's engine steps, the job's critical path) keeps its core and the child takes what
    is left; where they are not, it changes nothing."""

    def __init__(self, preparers: Sequence[RowPreparer], columns: ColumnMap, *, niceness: int = 0) -> None:
        if not 0 <= niceness <= 19:
            raise ValueError(f"niceness must be in [0, 19], got {niceness}")
        self._preparers = list(preparers)
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        code = (
            "from batchgen.job.prepare_stage import _child_main; "
            f"_child_main({to_child_r}, {from_child_w}, {niceness})"
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-c", code], pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, env=env
            )
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            raise
        os.close(to_child_r)
        os.close(from_child_w)
        self._requests = Connection(to_child_w, readable=False)
        self._answers = Connection(from_child_r, writable=False)
        self._lock = threading.Lock()
        self._waiting: collections.deque[Future[Any]] = collections.deque()
        self._outbox: queue.SimpleQueue[tuple[Future[Any], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._broken: BaseException | None = None
        self._closed = False
        # A writer thread, so that a batch waiting for room in the pipe never blocks the caller
        # (the pipeline's event loop), and a reader thread that settles the futures in order.
        self._writer = threading.Thread(target=self._write, name="batchgen-prepare-send", daemon=True)
        self._reader = threading.Thread(target=self._read, name="batchgen-prepare-receive", daemon=True)
        self._writer.start()
        self._reader.start()
        self._request(("start", self._preparers, columns))

    def _request(self, request: tuple[Any, ...]) -> Future[Any]:
        if self._closed:
            raise RuntimeError("the prepare process is closed")
        future: Future[Any] = Future()
        self._outbox.put((future, request))
        return future

    def _write(self) -> None:
        while (entry := self._outbox.get()) is not None:
            future, request = entry
            with self._lock:
                if self._broken is not None:
                    future.set_exception(self._broken)
                    continue
                self._waiting.append(future)
            try:
                self._requests.send_bytes(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
            except (OSError, ValueError):  # the child is gone: the reader fails the futures
                continue

    def _read(self) -> None:
        while True:
            try:
                status, value = pickle.loads(self._answers.recv_bytes())
            except (EOFError, OSError):
                break
            with self._lock:
                future = self._waiting.popleft()
            _settle(future, status, value)
        code = self._child.wait()
        with self._lock:
            self._broken = ChildProcessError(f"the prepare process ended (exit code {code})")
            waiting, self._waiting = list(self._waiting), collections.deque()
        for future in waiting:
            _settle(future, "error", self._broken)

    def submit(self, index: int, item: PrepareItem) -> Future[list[PreparedRow]]:
        if not 0 <= index < len(self._preparers):
            raise IndexError(f"no preparer {index} (the process holds {len(self._preparers)})")
        return self._request(("prepare", index, item))

    def close(self) -> None:
        """Copy the child's id sets back into the preparers, then end the child. Raises what
        the child raised, or ChildProcessError if it died."""
        if self._closed:
            return
        try:
            states = self._request(("ids",)).result()
            for preparer, state in zip(self._preparers, states, strict=True):
                preparer.restore_id_state(state)
        finally:
            self.terminate()

    def terminate(self) -> None:
        """End the child at once; futures not settled yet fail with ChildProcessError."""
        if self._closed:
            return
        self._closed = True
        self._child.kill()  # a send blocked on a full pipe then fails, and the writer goes on
        self._outbox.put(None)
        self._writer.join()
        self._reader.join()
        self._requests.close()
        self._answers.close()

    @property
    def pid(self) -> int:
        return self._child.pid

    def __enter__(self) -> PrepareProcess:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.terminate()


@dataclass(frozen=True, slots=True)
class ProcessPreparer:
    """The pipeline's handle on one preparer of a `PrepareProcess`."""

    process: PrepareProcess
    index: int

    def submit(self, item: PrepareItem) -> Future[list[PreparedRow]]:
        return self.process.submit(self.index, item)
