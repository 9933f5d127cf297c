"""``timeline.parquet`` next to ``summary.json``: the engine timelines of a job's runs.

Owns the rows of earlier runs read at the start of a run and the run id of this one. Every save
rewrites the whole file (earlier runs, then this run's current rows) through
`write_parquet_atomic`, so a `kill -9` at any moment leaves the previous version whole; a
resumed job appends its run, labelled with its own `run_id` and `run_index`. The file stays
small: each run holds at most `timeline_rows` rows (plus one open row).

Also describes the run's environment (versions, machine) for ``summary.json`` and the report.

May import: batchgen.io, batchgen.engine (the row type), pyarrow, torch (lazily, for the machine).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from batchgen import __version__
from batchgen.engine.timeline import Timeline, TimelineRow
from batchgen.io import TIMELINE_NAME, write_parquet_atomic
from batchgen.job.stages import JobError

__all__ = ["TimelineFile", "describe_environment", "new_run_id", "timeline_schema", "timeline_table"]

_FLOAT_FIELDS = {"t_start", "t_end", "step_s", "seqs_running", "seqs_waiting", "kv_blocks_used",
                 "kv_blocks_cached", "kv_blocks_free"}


def timeline_schema() -> pa.Schema:
    """run_id, run_index, then the `TimelineRow` fields (float64 or int64)."""
    columns = [pa.field("run_id", pa.string()), pa.field("run_index", pa.int32())]
    for name in TimelineRow.field_names():
        columns.append(pa.field(name, pa.float64() if name in _FLOAT_FIELDS else pa.int64()))
    return pa.schema(columns)


def timeline_table(rows: Sequence[TimelineRow], *, run_id: str, run_index: int) -> pa.Table:
    """`rows` as a table of `timeline_schema()`, every row labelled with the run."""
    columns: dict[str, list[Any]] = {"run_id": [run_id] * len(rows), "run_index": [run_index] * len(rows)}
    for name in TimelineRow.field_names():
        columns[name] = [getattr(r, name) for r in rows]
    return pa.table(columns, schema=timeline_schema())


def new_run_id() -> str:
    """A run id: the UTC start time to the microsecond and the process id."""
    return f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%S.%fZ')}-{os.getpid()}"


class TimelineFile:
    """The timeline file of one output folder, for one run of an engine's `Timeline`."""

    def __init__(
        self,
        out_dir: Path,
        run_id: str,
        timeline: Timeline,
        *,
        keep_previous: bool,
        save_every_s: float = 60.0,
        name: str = TIMELINE_NAME,
    ) -> None:
        """save_every_s: the least time between two saves by `save_if_due`. keep_previous: append to the runs already in the file (a resume); otherwise the
        file's old content is dropped at the first save (a first run or a --restart).
        Raises JobError if an earlier file cannot be read as a timeline."""
        self.path = out_dir / name  # `JobFolder.timeline_name`
        self.run_id = run_id
        self._timeline = timeline
        self._save_every_s = save_every_s
        self._last_save = time.monotonic()
        self._schema = timeline_schema()
        self._previous = self._schema.empty_table()
        if keep_previous and self.path.is_file():
            try:
                previous = pq.read_table(self.path)
                for name in self._schema.names:  # a column added since that file was written: 0
                    if name not in previous.column_names:
                        previous = previous.append_column(
                            name, pa.array([0] * previous.num_rows, self._schema.field(name).type)
                        )
                self._previous = previous.select(self._schema.names).cast(self._schema)
            except (pa.ArrowException, KeyError, OSError) as exc:
                raise JobError(
                    f"{self.path} is not a timeline this version can extend ({exc}); "
                    "delete it or run with --restart"
                ) from exc
        indices = self._previous.column("run_index").to_pylist()
        self.run_index = max(indices) + 1 if indices else 0

    def table(self, rows: Sequence[TimelineRow]) -> pa.Table:
        """The earlier runs' rows followed by `rows`, labelled with this run."""
        current = timeline_table(rows, run_id=self.run_id, run_index=self.run_index)
        return pa.concat_tables([self._previous, current])

    def save(self) -> None:
        """Rewrite the file atomically with the earlier runs and this run's rows. Blocking."""
        self._last_save = time.monotonic()
        write_parquet_atomic(self.path, self.table(self._timeline.rows()))

    def save_if_due(self) -> None:
        """`save` when save_every_s have passed since the last one (a long shard in progress)."""
        if time.monotonic() - self._last_save >= self._save_every_s:
            self.save()


def describe_environment(
    device: str, dtype: str, num_kv_blocks: int, linear_dtype: str | None = None
) -> dict[str, Any]:
    """Versions and machine of this process, JSON-able, for summary.json and the report
    (`linear_dtype`: the linear layers' product dtype, recorded where it is not `dtype`)."""
    import numpy
    import torch

    gpu = None
    if torch.cuda.is_available():
        gpu = {
            "name": torch.cuda.get_device_name(0),
            "count": torch.cuda.device_count(),
            "memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
        }
    return {
        "versions": {
            "batchgen": __version__,
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "pyarrow": pa.__version__,
            "numpy": numpy.__version__,
        },
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "gpu": gpu,
        },
        "engine": {
            "device": device,
            "dtype": dtype,
            "num_kv_blocks": num_kv_blocks,
            **({"linear_dtype": linear_dtype} if linear_dtype not in (None, dtype) else {}),
        },
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return str(line.split(":", 1)[1].strip())
    except OSError:
        pass
    return str(platform.processor() or platform.machine())
