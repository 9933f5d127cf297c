"""Fault hooks for the `executor: ray` tests (no tests in here).

`run_ray_job(..., worker_setup=...)` runs a hook in each worker process before it loads the
model; these hooks patch `OutputShardWriter.write` there, so the fault strikes in the middle of
a shard, after its temporary output file was opened. They are plain module functions (bound
with functools.partial), importable by the workers through PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

__all__ = ["fail_on_write", "kill_on_write"]


def kill_on_write(shard_name: str, marker: str) -> None:
    """SIGKILL this worker at its first write to `shard_name` unless `marker` exists; write the
    marker first (pid and temporary file), so only the first attempt dies."""
    from batchgen.io.writer import OutputShardWriter

    real = OutputShardWriter.write

    def write(self: Any, batch: Any) -> None:
        if self.final_path.name == shard_name and not os.path.exists(marker):
            note = {"pid": os.getpid(), "temp": str(self.temp_path), "temp_existed": self.temp_path.exists()}
            Path(marker).write_text(json.dumps(note))
            os.kill(os.getpid(), signal.SIGKILL)
        real(self, batch)

    OutputShardWriter.write = write  # type: ignore[method-assign]


def fail_on_write(shard_name: str) -> None:
    """Raise at every first write to `shard_name`: the shard fails on every attempt."""
    from batchgen.io.writer import OutputShardWriter

    real = OutputShardWriter.write

    def write(self: Any, batch: Any) -> None:
        if self.final_path.name == shard_name:
            raise RuntimeError(f"injected fault writing {shard_name}")
        real(self, batch)

    OutputShardWriter.write = write  # type: ignore[method-assign]
