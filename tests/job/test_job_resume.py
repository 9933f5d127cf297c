"""`batchgen run job.yaml`: exactly once across `kill -9`, resume, skip, and a changed config.

One tiny model and one job (4 shards of 40 rows, n=2, seeded sampling) for the module. An
uninterrupted run is the reference; each kill point runs the job in its own output folder
through the kill wrapper (`job_helpers.py` as a script), which SIGKILLs its own process at a
chosen moment; a normal re-run must then produce exactly the reference.

`usage.cached_tokens` is the one column compared loosely (0 <= cached <= prompt_tokens): it
counts the prefix-cache hits of the run that produced the row, and a resumed run starts with a
cold cache and other ordering windows, so its hits differ by design. Every other value --
outputs, seeds, finish reasons, prompt and completion tokens -- must be identical.

Every job runs in a subprocess (OMP_NUM_THREADS=1, HF_HUB_OFFLINE=1, --threads 1).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tests.job.helpers import (
    KILL_WRAPPER,
    file_state,
    final_shards,
    make_prompt_shards,
    read_outputs,
    run_cli_subprocess,
    subprocess_env,
    temp_files,
    write_job,
)
from tests.tiny_models import make_tiny_hf_folder

# Subprocess-heavy / scale: `python -m pytest -m "not slow"` leaves them out while iterating.
pytestmark = pytest.mark.slow

NUM_SHARDS = 4
ROWS_PER_SHARD = 40
N = 2
SHARD_NAMES = [f"part-{s}.parquet" for s in range(NUM_SHARDS)]
RUN = ["run", "job.yaml", "--quiet", "--threads", "1"]
_KILL_SEED = 20240611


class Job:
    """The module's job folder: inputs, job.yaml and the input rows per shard."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.input_ids = {
            p.name: pq.read_table(p).column("id").to_pylist()
            for p in make_prompt_shards(
                folder / "in", num_shards=NUM_SHARDS, rows_per_shard=ROWS_PER_SHARD
            )
        }

    def run(self, out: str, *extra: str, wrapper: list[str] | None = None) -> Any:
        return run_cli_subprocess(
            [*RUN, "--set", f"output.path={out}", *extra], cwd=self.folder, wrapper=wrapper
        )


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    model = make_tiny_hf_folder(
        tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64
    )
    folder = tmp_path_factory.mktemp("job")
    write_job(
        folder / "job.yaml",
        {
            "model": str(model),
            "input": {"path": "in", "batch_rows": 8},
            "output": {"path": "out"},
            "sampling": {"max_tokens": 6, "temperature": 0.8, "n": N},
            # A few sequences at a time and small ordering windows: shards finish one after
            # another and each is written in several batches (throughput knobs, not fingerprinted).
            "engine": {"device": "cpu", "max_num_seqs": 4},
            "window_rows": 16,
        },
    )
    return Job(folder)


@pytest.fixture(scope="module")
def reference(job: Job) -> dict[str, pa.Table]:
    result = job.run("out-ref")
    assert result.returncode == 0, result.stderr
    return read_outputs(job.folder / "out-ref")


# --- checks -------------------------------------------------------------------------------------


def _usage(table: pa.Table, name: str) -> list[int]:
    values: list[int] = pc.struct_field(table.column("usage").combine_chunks(), name).to_pylist()
    return values


def assert_same_rows(got: pa.Table, want: pa.Table, where: str) -> None:
    """Equal tables, except usage.cached_tokens (see the module docstring)."""
    assert got.schema.equals(want.schema), f"{where}: schema\n{got.schema}\nexpected\n{want.schema}"
    assert got.drop_columns(["usage"]).equals(want.drop_columns(["usage"])), f"{where}: rows differ"
    for name in ("prompt_tokens", "completion_tokens"):
        assert _usage(got, name) == _usage(want, name), f"{where}: usage.{name} differs"
    for cached, prompt in zip(
        _usage(got, "cached_tokens"), _usage(got, "prompt_tokens"), strict=True
    ):
        assert 0 <= cached <= prompt


def assert_complete_shard(table: pa.Table, input_ids: list[int], where: str) -> None:
    """One row per (input row, sample), in input order, none missing, none twice."""
    pairs = list(
        zip(table.column("id").to_pylist(), table.column("sample_index").to_pylist(), strict=True)
    )
    assert len(set(pairs)) == len(pairs), f"{where}: duplicate (id, sample_index)"
    assert pairs == [(i, s) for i in input_ids for s in range(N)], (
        f"{where}: rows missing or out of order"
    )


def assert_finished_output(job: Job, out_dir: Path, reference: dict[str, pa.Table]) -> None:
    """The output folder of a finished job equals the reference and its manifest is complete."""
    assert temp_files(out_dir) == []
    tables = read_outputs(out_dir)
    assert sorted(tables) == SHARD_NAMES
    for name, table in tables.items():
        assert_complete_shard(table, job.input_ids[name], name)
        assert_same_rows(table, reference[name], name)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == SHARD_NAMES
    for record in manifest["shards"].values():
        assert record["num_input_rows"] == ROWS_PER_SHARD
        assert record["num_output_rows"] == ROWS_PER_SHARD * N


def _num_row_groups(path: Path) -> int:
    with pq.ParquetFile(path) as f:
        return int(f.num_row_groups)


# --- tests --------------------------------------------------------------------------------------


def test_reference_run_is_complete_and_written_in_batches(
    job: Job, reference: dict[str, pa.Table]
) -> None:
    out_dir = job.folder / "out-ref"
    assert_finished_output(job, out_dir, reference)
    for name, table in reference.items():
        assert table.column("finish_reason").to_pylist().count("error") == 0
        # Each writer call is one row group: several batches per shard, so kills can land mid-shard.
        assert _num_row_groups(out_dir / name) >= 2
    # The prompts share long prefixes: the prefix cache is in play.
    assert sum(sum(_usage(t, "cached_tokens")) for t in reference.values()) > 0
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["shards"] == {"committed_this_run": NUM_SHARDS, "skipped": 0}
    assert summary["rows"]["output_rows"] == NUM_SHARDS * ROWS_PER_SHARD * N


def _random_write(job: Job) -> str:
    # A writer call drawn with a fixed seed among those the reference run made (one row group
    # each), leaving out the last so that a run that happened to batch differently still hits it.
    total = sum(_num_row_groups(p) for p in final_shards(job.folder / "out-ref"))
    return str(random.Random(_KILL_SEED).randint(1, total - 1))


def _random_io_moment(seed: int) -> Callable[[Job], str]:
    # An I/O moment (fsync, rename, shard write) drawn with a fixed seed, after the manifest's
    # creation (its 3 moments) and before the last moment the reference run surely made: one
    # write per row group, then fsync + rename + folder fsync for each shard and for each
    # manifest save after it.
    def pick(job: Job) -> str:
        writes = sum(_num_row_groups(p) for p in final_shards(job.folder / "out-ref"))
        return str(random.Random(seed).randint(4, writes + 6 * NUM_SHARDS))

    return pick


KILL_POINTS: dict[str, tuple[str, Callable[[Job], str]]] = {
    "mid-shard-write": ("write", lambda job: f"{SHARD_NAMES[1]}:2"),
    "before-rename": ("before_rename", lambda job: "2"),
    "after-rename-before-manifest": ("after_rename", lambda job: "2"),
    "start-of-second-shard-read": ("read", lambda job: SHARD_NAMES[1]),
    "random-write": ("write_any", _random_write),
    "before-manifest-replace": ("before_manifest_replace", lambda job: "3"),
    "after-manifest-replace": ("after_manifest_replace", lambda job: "3"),
    **{f"random-io-{seed}": ("io", _random_io_moment(seed)) for seed in (_KILL_SEED, 7, 99)},
}


@pytest.mark.parametrize("point", list(KILL_POINTS))
def test_resume_after_kill_is_exactly_once(
    job: Job, reference: dict[str, pa.Table], point: str
) -> None:
    kind, arg_of = KILL_POINTS[point]
    out = f"out-kill-{point}"
    out_dir = job.folder / out
    note_path = job.folder / f"note-{point}.json"
    killed = job.run(out, wrapper=[str(note_path), kind, arg_of(job)])
    assert killed.returncode == -9, f"not killed (rc {killed.returncode}): {killed.stderr[-2000:]}"
    note = json.loads(note_path.read_text())
    assert note["kind"] == kind

    # Whatever exists under a final name is whole: it reads back and equals the reference.
    survivors = {p.name: file_state(p) for p in final_shards(out_dir)}
    for name, table in read_outputs(out_dir).items():
        assert_same_rows(table, reference[name], f"{name} after the kill")
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert set(manifest["shards"]) <= set(survivors)
    if kind == "before_rename":
        assert note["shard"] not in survivors
        assert any(p.name.startswith(f".{note['shard']}.tmp-") for p in temp_files(out_dir))
    if kind == "after_rename":
        # Renamed, but the manifest does not know yet: the re-run must adopt the file as it is.
        assert note["shard"] in survivors
        assert note["shard"] not in manifest["shards"]
    if kind == "read":
        assert note["shard"] not in survivors

    resumed = job.run(out)
    assert resumed.returncode == 0, resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert_finished_output(job, out_dir, reference)
    # Shards that survived the kill were skipped, not redone: same bytes, same file.
    for name, state in survivors.items():
        assert file_state(out_dir / name) == state, f"{name} was rewritten"
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["shards"] == {
        "committed_this_run": NUM_SHARDS - len(survivors),
        "skipped": len(survivors),
    }
    assert summary["rows"]["output_rows"] == (NUM_SHARDS - len(survivors)) * ROWS_PER_SHARD * N
    if kind == "after_rename":
        # The record rebuilt from the adopted file says what a normal commit would have said.
        manifest = json.loads((out_dir / "manifest.json").read_text())
        ref_manifest = json.loads((job.folder / "out-ref" / "manifest.json").read_text())
        assert _comparable_record(manifest["shards"][note["shard"]]) == _comparable_record(
            ref_manifest["shards"][note["shard"]]
        )


def _comparable_record(record: dict[str, Any]) -> dict[str, Any]:
    # wall_s and cached_tokens describe the run that wrote the shard, not the shard.
    return {k: v for k, v in record.items() if k not in ("wall_s", "cached_tokens")}


def test_kill_during_restart_then_resume_loses_nothing(
    job: Job, reference: dict[str, pa.Table]
) -> None:
    # `--restart` deletes the old shards; killed after two deletions, the folder still holds the
    # old manifest. Resuming the same job (no --restart) must not trust the manifest for the
    # deleted shards.
    out = "out-restart-kill"
    out_dir = job.folder / out
    shutil.copytree(job.folder / "out-ref", out_dir)
    note_path = job.folder / "note-restart-kill.json"
    killed = job.run(out, "--restart", wrapper=[str(note_path), "unlink", "2"])
    assert killed.returncode == -9, f"not killed (rc {killed.returncode}): {killed.stderr[-2000:]}"
    survivors = {p.name: file_state(p) for p in final_shards(out_dir)}
    assert len(survivors) == NUM_SHARDS - 2

    resumed = job.run(out)
    assert resumed.returncode == 0, resumed.stderr
    assert_finished_output(job, out_dir, reference)
    for name, state in survivors.items():
        assert file_state(out_dir / name) == state, f"{name} was rewritten"


def test_second_rerun_skips_everything_and_touches_nothing(
    job: Job, reference: dict[str, pa.Table]
) -> None:
    out_dir = job.folder / "out-ref"
    before = {p.name: file_state(p) for p in [*final_shards(out_dir), out_dir / "manifest.json"]}
    result = job.run("out-ref")
    assert result.returncode == 0, result.stderr
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["shards"] == {"committed_this_run": 0, "skipped": NUM_SHARDS}
    assert summary["rows"]["total"] == 0
    after = {p.name: file_state(p) for p in [*final_shards(out_dir), out_dir / "manifest.json"]}
    assert after == before
    assert temp_files(out_dir) == []
    assert_finished_output(job, out_dir, reference)


def test_changed_config_is_refused_then_restart_applies_it(
    job: Job, reference: dict[str, pa.Table]
) -> None:
    out = "out-config"
    out_dir = job.folder / out
    shutil.copytree(job.folder / "out-ref", out_dir)
    before = {p.name: file_state(p) for p in [*final_shards(out_dir), out_dir / "manifest.json"]}

    refused = job.run(out, "--set", "sampling.max_tokens=3")
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    assert "max_tokens" in refused.stderr
    assert "6 -> 3" in refused.stderr
    assert "--restart" in refused.stderr
    assert {
        p.name: file_state(p) for p in [*final_shards(out_dir), out_dir / "manifest.json"]
    } == before

    restarted = job.run(out, "--set", "sampling.max_tokens=3", "--restart")
    assert restarted.returncode == 0, restarted.stderr
    assert temp_files(out_dir) == []
    tables = read_outputs(out_dir)
    assert sorted(tables) == SHARD_NAMES
    completion = []
    for name, table in tables.items():
        assert_complete_shard(table, job.input_ids[name], name)
        assert table.column("finish_reason").to_pylist().count("error") == 0
        assert table.column("seed").equals(reference[name].column("seed"))
        completion += _usage(table, "completion_tokens")
    assert max(completion) == 3
    assert all(1 <= c <= 3 for c in completion)
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert manifest["fingerprint"]["job"]["sampling"]["max_tokens"] == 3
    assert sorted(manifest["shards"]) == SHARD_NAMES
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["shards"] == {"committed_this_run": NUM_SHARDS, "skipped": 0}


def test_a_real_sigint_exits_130_leaves_nothing_partial_and_resumes_exactly_once(
    job: Job, reference: dict[str, pa.Table]
) -> None:
    out = "out-sigint"
    out_dir = job.folder / out
    with subprocess.Popen(
        [sys.executable, str(KILL_WRAPPER), "-", "sigint_wait", "3", *RUN, "--set", f"output.path={out}"],
        cwd=job.folder,
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"  # mid-run: the third shard write
        os.kill(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=300)  # closes stdin: the write goes on
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert temp_files(out_dir) == []
    survivors = {p.name: file_state(p) for p in final_shards(out_dir)}
    assert len(survivors) < NUM_SHARDS
    for name, table in read_outputs(out_dir).items():
        assert_same_rows(table, reference[name], f"{name} after the interrupt")

    resumed = job.run(out)
    assert resumed.returncode == 0, resumed.stderr
    assert_finished_output(job, out_dir, reference)
    for name, state in survivors.items():
        assert file_state(out_dir / name) == state, f"{name} was rewritten"
