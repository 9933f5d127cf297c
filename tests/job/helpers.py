"""Shared helpers for the `batchgen run job.yaml` tests (no tests in here).

As a module: writing prompt shards and job files, reading output folders back, running the CLI
in a subprocess. As a script it is the kill wrapper of the resume tests: it patches one moment
of a job run to SIGKILL its own process, then calls `batchgen.cli.main.main`::

    python job_helpers.py NOTE KIND ARG run job.yaml --quiet ...

KIND / ARG pick the moment (counts start at 1):
- ``write SHARD:K``       the K-th `OutputShardWriter.write` to output shard SHARD, before it writes;
- ``write_any K``         the K-th `OutputShardWriter.write` of any shard, before it writes;
- ``before_rename K``     the K-th rename onto a final ``*.parquet`` output shard, before it;
- ``after_rename K``      the same rename, right after it (before the manifest is saved);
- ``timeline_rename K``   the K-th rename onto ``timeline.parquet``, before it (its temporary
                          file is written and fsynced);
- ``read SHARD``          when the reading of input shard SHARD starts;
- ``unlink K``            right after the K-th deletion of a final ``*.parquet`` output shard
                          (what ``--restart`` does to the old outputs);
- ``before_manifest_replace K`` / ``after_manifest_replace K``  around the K-th ``os.replace``
                          onto ``manifest.json`` (the first is the manifest's creation);
- ``sigint_wait K``       at the K-th `OutputShardWriter.write` of any shard: print ``ready``
                          and wait for stdin to close before writing (the test sends SIGINT
                          meanwhile; nothing is killed);
- ``io K``                before the K-th I/O moment of any kind: an ``os.fsync``, an
                          ``os.replace`` or an `OutputShardWriter.write` (the tests draw K with
                          a fixed seed).

Before killing, the wrapper writes the moment as JSON to NOTE ({"kind", "shard", "count"}), so
the test knows which shard was hit. A kill that never happens lets the run finish (exit 0), which
the tests report as a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

__all__ = [
    "KILL_WRAPPER",
    "file_state",
    "final_shards",
    "make_prompt_shards",
    "read_outputs",
    "run_cli_subprocess",
    "subprocess_env",
    "temp_files",
    "write_job",
]

KILL_WRAPPER = Path(__file__).resolve()
_REPO_ROOT = KILL_WRAPPER.parents[2]
TIMELINE = "timeline.parquet"  # the job's timeline beside the shards, not an output shard

_PREAMBLES = (
    "You are a careful assistant. Answer every question about geography, history and science "
    "in one short sentence, without any preamble or apology. ",
    "Translate the following English sentence into French, keeping the names unchanged and the "
    "punctuation as it is. ",
)
_TOPICS = ("rivers", "mountains", "the moon", "volcanoes", "glaciers", "deserts", "tides")


def make_prompt_shards(
    folder: Path, *, num_shards: int, rows_per_shard: int, first_id: int = 0
) -> list[Path]:
    """Write `num_shards` shards `part-{s}.parquet` of (id int64, prompt string) into `folder`.

    Ids are distinct integers over all shards; about two rows in three start with one of two long
    shared preambles (more than one KV block), the rest are short unique prompts.
    """
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for shard in range(num_shards):
        ids = [first_id + shard * 1000 + i for i in range(rows_per_shard)]
        prompts = []
        for i, row_id in enumerate(ids):
            topic = _TOPICS[(row_id * 7 + i) % len(_TOPICS)]
            if i % 3 == 2:
                prompts.append(f"Name one fact about {topic} ({row_id}).")
            else:
                prompts.append(f"{_PREAMBLES[i % 3]}Question {row_id}: what about {topic}?")
        path = folder / f"part-{shard}.parquet"
        pq.write_table(
            pa.table({"id": pa.array(ids, pa.int64()), "prompt": pa.array(prompts, pa.string())}),
            path,
        )
        paths.append(path)
    return paths


def write_job(path: Path, data: Mapping[str, Any]) -> Path:
    """Write `data` as a YAML job file at `path`; return `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False), encoding="utf-8")
    return path


def final_shards(out_dir: Path) -> list[Path]:
    """The final output shards in `out_dir` (``*.parquet``, no temporary files, not the job's
    ``timeline.parquet``), sorted."""
    return sorted(
        p for p in out_dir.glob("*.parquet") if not p.name.startswith(".") and p.name != TIMELINE
    )


def temp_files(out_dir: Path) -> list[Path]:
    """Files a run left in `out_dir` under a temporary name (``.*.tmp-*``)."""
    return sorted(p for p in out_dir.iterdir() if p.name.startswith(".") and ".tmp-" in p.name)


def read_outputs(out_dir: Path) -> dict[str, pa.Table]:
    """Every final output shard of `out_dir`, read whole, by file name."""
    return {p.name: pq.read_table(p) for p in final_shards(out_dir)}


def file_state(path: Path) -> tuple[str, int, int]:
    """(sha256, mtime_ns, inode) of a file: equal only if it was neither rewritten nor replaced."""
    st = path.stat()
    return hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_ino


def subprocess_env() -> dict[str, str]:
    """The environment of a job subprocess: one thread, offline, and this checkout's code first
    (an editable install elsewhere would otherwise answer `import batchgen`)."""
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false"
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_cli_subprocess(
    args: Sequence[str], *, cwd: Path, wrapper: Sequence[str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m batchgen ARGS`` (or the kill wrapper with `wrapper` arguments first)."""
    head = (
        [sys.executable, "-m", "batchgen"]
        if wrapper is None
        else [sys.executable, str(KILL_WRAPPER), *wrapper]
    )
    return subprocess.run(
        [*head, *args],
        cwd=cwd,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# --- the kill wrapper --------------------------------------------------------------------------


def _die(note: Path, kind: str, shard: str | None, count: int) -> None:
    note.write_text(json.dumps({"kind": kind, "shard": shard, "count": count}))
    os.kill(os.getpid(), signal.SIGKILL)


def _patch_writes(note: Path, kind: str, arg: str) -> None:
    from batchgen.io import writer

    real_write = writer.OutputShardWriter.write
    if kind == "write":
        target, _, k = arg.partition(":")
        wanted = int(k)
    else:
        target, wanted = "", int(arg)
    counts: dict[str, int] = {}

    def write(self: Any, batch: pa.RecordBatch) -> None:
        name = self.final_path.name
        key = name if kind == "write" else ""
        counts[key] = counts.get(key, 0) + 1
        if (kind == "write_any" or name == target) and counts[key] == wanted:
            _die(note, kind, name, wanted)
        real_write(self, batch)

    writer.OutputShardWriter.write = write


def _patch_renames(note: Path, kind: str, arg: str) -> None:
    # Patched on the os module itself, so whatever name the writer reaches it by is covered;
    # only renames onto a final output shard (*.parquet, not a dot file) count.
    real_replace = os.replace
    wanted = int(arg)
    count = 0

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        nonlocal count
        name = Path(os.fsdecode(dst)).name
        if kind == "timeline_rename":
            if name == TIMELINE:
                count += 1
                if count == wanted:
                    _die(note, kind, name, count)
        elif name.endswith(".parquet") and not name.startswith(".") and name != TIMELINE:
            count += 1
            if count == wanted and kind == "before_rename":
                _die(note, kind, name, count)
            real_replace(src, dst, **kwargs)
            if count == wanted:
                _die(note, kind, name, count)
            return
        real_replace(src, dst, **kwargs)

    os.replace = replace


def _patch_reads(note: Path, shard: str) -> None:
    import batchgen.io.reader
    import batchgen.job.files
    import batchgen.job.run

    patched = 0
    modules: tuple[Any, ...] = (batchgen.io.reader, batchgen.job.run, batchgen.job.files)
    for module in modules:
        real: Callable[..., Any] | None = getattr(module, "iter_shard_batches", None)
        if real is None:
            continue

        def iter_shard_batches(path: Path, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if Path(path).name == shard:
                _die(note, "read", shard, 1)
            return _real(path, *args, **kwargs)

        module.iter_shard_batches = iter_shard_batches
        patched += 1
    if not patched:
        raise SystemExit("kill wrapper: found no iter_shard_batches to patch")


def _patch_unlinks(note: Path, arg: str) -> None:
    import pathlib

    real_unlink = pathlib.Path.unlink
    wanted = int(arg)
    count = 0

    def unlink(self: pathlib.Path, missing_ok: bool = False) -> None:
        nonlocal count
        existed = self.is_file()
        real_unlink(self, missing_ok=missing_ok)
        if existed and self.name.endswith(".parquet") and not self.name.startswith("."):
            count += 1
            if count == wanted:
                _die(note, "unlink", self.name, count)

    pathlib.Path.unlink = unlink  # type: ignore[method-assign]


def _patch_manifest_replace(note: Path, kind: str, arg: str) -> None:
    real_replace = os.replace
    wanted = int(arg)
    count = 0

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        nonlocal count
        if Path(os.fsdecode(dst)).name != "manifest.json":
            real_replace(src, dst, **kwargs)
            return
        count += 1
        if count == wanted and kind == "before_manifest_replace":
            _die(note, kind, "manifest.json", count)
        real_replace(src, dst, **kwargs)
        if count == wanted:
            _die(note, kind, "manifest.json", count)

    os.replace = replace


def _patch_sigint_wait(arg: str) -> None:
    # A process started with SIGINT ignored keeps it ignored (Python installs its handler only
    # over the default), and pytest-xdist's workers ignore it: put Ctrl-C's KeyboardInterrupt
    # back, as a terminal's job would have it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from batchgen.io import writer

    real_write = writer.OutputShardWriter.write
    wanted = int(arg)
    count = 0

    def write(self: Any, batch: pa.RecordBatch) -> None:
        nonlocal count
        count += 1
        if count == wanted:
            print("ready", flush=True)
            sys.stdin.read()  # until the test closes our stdin
        real_write(self, batch)

    writer.OutputShardWriter.write = write


def _patch_io(note: Path, arg: str) -> None:
    from batchgen.io import writer

    wanted = int(arg)
    count = 0

    def moment(what: str) -> None:
        nonlocal count
        count += 1
        if count == wanted:
            _die(note, "io", what, count)

    real_fsync, real_replace, real_write = os.fsync, os.replace, writer.OutputShardWriter.write

    def fsync(fd: int) -> None:
        moment("fsync")
        real_fsync(fd)

    def replace(src: Any, dst: Any, **kwargs: Any) -> None:
        moment(f"replace {Path(os.fsdecode(dst)).name}")
        real_replace(src, dst, **kwargs)

    def write(self: Any, batch: pa.RecordBatch) -> None:
        moment(f"write {self.final_path.name}")
        real_write(self, batch)

    os.fsync = fsync
    os.replace = replace
    writer.OutputShardWriter.write = write


def _wrapper_main(argv: list[str]) -> int:
    note, kind, arg, *cli_args = argv
    if kind in ("write", "write_any"):
        _patch_writes(Path(note), kind, arg)
    elif kind in ("before_rename", "after_rename", "timeline_rename"):
        _patch_renames(Path(note), kind, arg)
    elif kind == "read":
        _patch_reads(Path(note), arg)
    elif kind == "unlink":
        _patch_unlinks(Path(note), arg)
    elif kind in ("before_manifest_replace", "after_manifest_replace"):
        _patch_manifest_replace(Path(note), kind, arg)
    elif kind == "io":
        _patch_io(Path(note), arg)
    elif kind == "sigint_wait":
        _patch_sigint_wait(arg)
    else:
        raise SystemExit(f"kill wrapper: unknown kind {kind!r}")
    from batchgen.cli.main import main

    return main(cli_args)


if __name__ == "__main__":
    sys.exit(_wrapper_main(sys.argv[1:]))
