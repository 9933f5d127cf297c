"""Fault hooks for the `executor: ray` tests (no tests in here).

`run_ray_job(..., worker_setup=...)` runs a hook in each worker process before it loads the
model; these hooks patch `OutputShardWriter.write` there, so the fault strikes in the middle of
a shard, after its temporary output file was opened (or patch `os.replace` to die right after a
shard's rename, before the driver hears of it), or make the worker load another model than the
driver's. They are plain module functions (bound with functools.partial), importable by the
workers through PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

__all__ = ["fail_on_write", "kill_after_rename", "kill_on_write", "load_model_from", "run_all"]


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


def kill_after_rename(shard_name: str, marker: str) -> None:
    """SIGKILL this worker right after it renamed `shard_name` into place (the driver has not
    recorded it) unless `marker` exists; the marker holds the file's inode and mtime."""
    real = os.replace

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        real(src, dst, **kwargs)
        if Path(os.fsdecode(dst)).name == shard_name and not os.path.exists(marker):
            st = os.stat(dst)
            Path(marker).write_text(json.dumps({"inode": st.st_ino, "mtime_ns": st.st_mtime_ns}))
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace


def load_model_from(model: str) -> None:
    """Load `model` in this worker in place of the job's: a node whose copy of the model path
    holds other files."""
    import dataclasses

    from batchgen.ray import worker

    real = worker.load_model

    def load_model(config: Any) -> Any:
        return real(dataclasses.replace(config, model=model))

    worker.load_model = load_model  # type: ignore[assignment]


def run_all(*hooks: Any) -> None:
    """Run several hooks (each a callable without arguments)."""
    for hook in hooks:
        hook()
