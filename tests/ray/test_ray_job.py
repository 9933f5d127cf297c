"""`executor: ray`: 6 shards over 2 Ray actors write exactly what `executor: local` writes, also
when an actor is killed mid-shard, a shard keeps failing, or the driver is SIGKILLed; a worker
with another model is refused; an input unreadable mid-read is a bad shard under
``on_bad_shard: skip`` as in a local run; losing the node's Ray processes mid-job ends the run
with one message, and a rerun on a fresh Ray finishes it (issue 20, defects 7 and 11).

One Ray runtime for the module (tests/ray/conftest.py), one tiny model, one job: 6 shards of 12
rows, small batches and windows so that each shard is written in several batches. The driver
runs in this process, except in the driver-kill test (a subprocess that joins the runtime). Local runs
(in this process) are the references, greedy and seeded sampling with n=2.
`usage.cached_tokens` is compared loosely: it counts the prefix-cache hits of the engine that
produced the row (each actor has its own cache), by design.
"""

from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batchgen.io import InputError, ShardReadError
from batchgen.job.config import JobConfig
from batchgen.job.config_file import load_job_config
from batchgen.job.run import run_job
from batchgen.job.stages import JobError
from tests.job.helpers import (
    file_state,
    make_prompt_shards,
    read_outputs,
    subprocess_env,
    temp_files,
    write_job,
)
from tests.job.test_job_bad_shards import three_shards
from tests.ray import hooks
from tests.tiny_models import make_tiny_hf_folder

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

NUM_SHARDS = 6
ROWS_PER_SHARD = 12
SHARD_NAMES = [f"part-{s}.parquet" for s in range(NUM_SHARDS)]
KINDS = {
    "greedy": (1, ["sampling.temperature=0"]),
    "sampled": (2, ["sampling.temperature=0.8", "sampling.n=2"]),
}
KILL_DRIVER = Path(__file__).resolve().parent / "kill_driver.py"
LOSE_NODE = Path(__file__).resolve().parent / "lose_node.py"
RAY_OVERRIDES = ["executor=ray", "ray.num_workers=2", "ray.num_cpus_per_worker=0.5", "ray.max_retries=1"]


class Job:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        paths = make_prompt_shards(folder / "in", num_shards=NUM_SHARDS, rows_per_shard=ROWS_PER_SHARD)
        self.input_ids = {p.name: pq.read_table(p).column("id").to_pylist() for p in paths}
        self._references: dict[str, dict[str, pa.Table]] = {}

    def config(self, out: str, kind: str, *overrides: str) -> JobConfig:
        return load_job_config(
            self.folder / "job.yaml", [f"output.path={out}", *KINDS[kind][1], *overrides]
        )

    def reference(self, kind: str) -> dict[str, pa.Table]:
        """The local executor's output (computed once per kind)."""
        if kind not in self._references:
            run_job(self.config(f"out-local-{kind}", kind, "executor=local"), use_tqdm=False)
            self._references[kind] = read_outputs(self.folder / f"out-local-{kind}")
        return self._references[kind]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Job:
    folder = tmp_path_factory.mktemp("rayjob")
    write_job(
        folder / "job.yaml",
        {
            "model": str(model),
            "input": {"path": "in", "batch_rows": 4},
            "output": {"path": "out"},
            "sampling": {"max_tokens": 6},
            "engine": {"device": "cpu", "max_num_seqs": 4},
            "window_rows": 8,
            "executor": "ray",
            "ray": {"num_workers": 2, "num_cpus_per_worker": 0.5, "max_retries": 1},
        },
    )
    return Job(folder)


def _usage(table: pa.Table, name: str) -> list[int]:
    values: list[int] = pc.struct_field(table.column("usage").combine_chunks(), name).to_pylist()
    return values


def assert_same_output(job: Job, out_dir: Path, kind: str) -> None:
    """Every shard as the local executor wrote it: rows in input order, each once, no temp file."""
    n = KINDS[kind][0]
    reference = job.reference(kind)
    assert temp_files(out_dir) == []
    tables = read_outputs(out_dir)
    assert sorted(tables) == SHARD_NAMES
    for name, got in tables.items():
        pairs = list(zip(got.column("id").to_pylist(), got.column("sample_index").to_pylist(), strict=True))
        assert pairs == [(i, s) for i in job.input_ids[name] for s in range(n)], name
        want = reference[name]
        assert got.schema.equals(want.schema), name
        assert got.drop_columns(["usage"]).equals(want.drop_columns(["usage"])), f"{name}: rows differ"
        for field in ("prompt_tokens", "completion_tokens"):
            assert _usage(got, field) == _usage(want, field), name
        assert all(0 <= c <= p for c, p in zip(_usage(got, "cached_tokens"), _usage(got, "prompt_tokens"), strict=True))
    manifest = json.loads((out_dir / "manifest.json").read_text())
    assert sorted(manifest["shards"]) == SHARD_NAMES
    assert all(r["num_output_rows"] == ROWS_PER_SHARD * n for r in manifest["shards"].values())


def test_six_shards_over_two_workers_equal_local(
    ray_runtime: Any, job: Job, capsys: pytest.CaptureFixture[str]
) -> None:
    """Greedy here; seeded sampling with n=2 is the kill test's job (same check, same pool)."""
    from batchgen.ray import run_ray_job

    kind = "greedy"
    job.reference(kind)
    capsys.readouterr()
    summary = run_ray_job(job.config(f"out-ray-{kind}", kind), use_tqdm=True)
    bar = capsys.readouterr().err  # one bar over both workers, fed by their progress
    assert f"{NUM_SHARDS * ROWS_PER_SHARD}/{NUM_SHARDS * ROWS_PER_SHARD}" in bar, bar
    assert "tok/s" in bar and "workers 2" in bar, bar
    out_dir = job.folder / f"out-ray-{kind}"
    assert_same_output(job, out_dir, kind)
    written = json.loads((out_dir / "summary.json").read_text())
    assert written == json.loads(json.dumps(summary.data))
    assert written["executor"] == "ray"
    assert written["shards"] == {"committed_this_run": NUM_SHARDS, "skipped": 0}
    assert written["rows"]["total"] == NUM_SHARDS * ROWS_PER_SHARD
    assert written["rows"]["output_rows"] == NUM_SHARDS * ROWS_PER_SHARD * KINDS[kind][0]
    assert written["ray"]["retries"] == {"total": 0, "by_shard": {}}
    workers = written["ray"]["workers"]
    assert len(workers) == 2 and all(w["state"] == "ok" for w in workers)
    assert sum(w["shards"] for w in workers) == NUM_SHARDS
    assert sum(w["rows"] for w in workers) == NUM_SHARDS * ROWS_PER_SHARD
    assert sum(w["output_tokens"] for w in workers) == written["tokens"]["output"]


def test_worker_killed_mid_shard_is_retried(ray_runtime: Any, job: Job, tmp_path: Path) -> None:
    """Seeded sampling with n=2 over 2 workers. One worker dies (SIGKILL) in the middle of
    part-2: retried. Another dies right after renaming part-4 into place, before returning it:
    recorded from the file, never generated twice."""
    from batchgen.ray import run_ray_job

    mid, renamed = tmp_path / "killed-mid.json", tmp_path / "killed-renamed.json"
    setup = functools.partial(
        hooks.run_all,
        functools.partial(hooks.kill_on_write, "part-2.parquet", str(mid)),
        functools.partial(hooks.kill_after_rename, "part-4.parquet", str(renamed)),
    )
    out_dir = job.folder / "out-kill"
    summary = run_ray_job(job.config("out-kill", "sampled"), use_tqdm=False, worker_setup=setup)
    note = json.loads(mid.read_text())  # the worker did die, holding a temporary file
    assert note["temp_existed"] and not Path(note["temp"]).exists()
    at_rename = json.loads(renamed.read_text())
    _, mtime_ns, inode = file_state(out_dir / "part-4.parquet")
    assert (inode, mtime_ns) == (at_rename["inode"], at_rename["mtime_ns"])
    assert_same_output(job, out_dir, "sampled")
    assert summary.data["ray"]["retries"] == {"total": 1, "by_shard": {"part-2.parquet": 1}}
    states = [w["state"] for w in summary.data["ray"]["workers"]]
    assert states.count("died") == 2 and len(states) == 4  # fresh workers took the dead ones' place
    assert summary.data["shards"]["committed_this_run"] == NUM_SHARDS


def test_shard_failing_every_attempt_stops_the_job(ray_runtime: Any, job: Job) -> None:
    from batchgen.ray import run_ray_job

    out_dir = job.folder / "out-fail"
    setup = functools.partial(hooks.fail_on_write, "part-3.parquet")
    with pytest.raises(JobError) as info:
        run_ray_job(job.config("out-fail", "greedy"), use_tqdm=False, worker_setup=setup)
    message = str(info.value)
    assert "shard part-3.parquet failed 2 times (ray.max_retries: 1)" in message, message
    assert "injected fault writing part-3.parquet" in message, message
    assert temp_files(out_dir) == []
    committed = json.loads((out_dir / "manifest.json").read_text())["shards"]
    assert "part-3.parquet" not in committed and not (out_dir / "part-3.parquet").exists()
    # A worker stopped with the job may have renamed its whole output before the driver recorded
    # it (a clean-clone CI run saw one): the rerun reconciles such a file and skips it too.
    whole = {path.name for path in out_dir.glob("part-*.parquet")}
    assert set(committed) <= whole
    before = {name: file_state(out_dir / name) for name in whole}

    summary = run_ray_job(job.config("out-fail", "greedy"), use_tqdm=False)  # the fault is gone
    assert summary.data["shards"] == {
        "committed_this_run": NUM_SHARDS - len(whole),
        "skipped": len(whole),
    }
    assert {name: file_state(out_dir / name) for name in whole} == before
    assert_same_output(job, out_dir, "greedy")


def _cli_killed(job: Job, ray_runtime: Any, out: str, note: Path, k: int) -> subprocess.CompletedProcess[str]:
    """`batchgen run` in a subprocess that joins the module's Ray and SIGKILLs itself right after
    the manifest records its k-th shard (tests/ray/kill_driver.py)."""
    address = ray_runtime.get_runtime_context().gcs_address
    head = [sys.executable, str(KILL_DRIVER), str(note), str(k)]
    args = ["run", "job.yaml", "--quiet", "--threads", "1", "--set", f"output.path={out}",
            "--set", f"ray.address={address}", "--set", "sampling.temperature=0"]
    return subprocess.run(
        [*head, *args], cwd=job.folder, env=subprocess_env(), capture_output=True, text=True,
        timeout=400, check=False,
    )


@pytest.mark.slow  # a job run in a subprocess
def test_driver_sigkill_then_rerun_resumes(ray_runtime: Any, job: Job, tmp_path: Path) -> None:
    out_dir = job.folder / "out-driver"
    note = tmp_path / "recorded.json"
    killed = _cli_killed(job, ray_runtime, "out-driver", note, 2)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    recorded = json.loads(note.read_text())
    assert len(recorded) == 2
    before = {name: file_state(out_dir / name) for name in recorded}

    from batchgen.ray import run_ray_job

    run_ray_job(job.config("out-driver", "greedy"), use_tqdm=False)
    summary = json.loads((out_dir / "summary.json").read_text())
    # The recorded shards are skipped; a shard renamed while the driver died is reconciled.
    assert summary["shards"]["skipped"] >= 2
    assert summary["shards"]["skipped"] + summary["shards"]["committed_this_run"] == NUM_SHARDS
    assert {name: file_state(out_dir / name) for name in recorded} == before
    assert_same_output(job, out_dir, "greedy")


def test_a_worker_with_another_model_is_refused(ray_runtime: Any, job: Job, tmp_path: Path) -> None:
    """Defect 7: a node whose model path holds other weights must not write output stamped
    with the driver's fingerprint (a resume would accept it)."""
    from batchgen.ray import run_ray_job

    other = make_tiny_hf_folder(tmp_path, num_heads=4, num_kv_heads=2, hidden_size=64, seed=7)
    setup = functools.partial(hooks.load_model_from, str(other))
    with pytest.raises(InputError) as info:
        run_ray_job(job.config("out-other-model", "greedy"), use_tqdm=False, worker_setup=setup)
    message = str(info.value)
    assert "the Ray worker on host " in message and "model.fingerprint: " in message, message
    assert message.count(" -> ") == 1, message  # only the model differs
    out_dir = job.folder / "out-other-model"
    assert [p.name for p in out_dir.iterdir() if p.suffix == ".parquet"] == []
    assert json.loads((out_dir / "manifest.json").read_text())["shards"] == {}


def test_a_shard_unreadable_mid_read_is_skipped_as_in_a_local_run(
    ray_runtime: Any, model: Path, tmp_path: Path
) -> None:
    """Defect 11: under on_bad_shard: skip, part-1 (footer fine, row group 2 corrupt) is a bad
    shard in the manifest and the summary, as the local executor records it; the job goes on."""
    from batchgen.ray import run_ray_job

    job_file = three_shards(tmp_path, "skip", model)
    run_job(load_job_config(job_file, ["output.path=out-local"]), use_tqdm=False)
    summary = run_ray_job(load_job_config(job_file, ["output.path=out-ray", *RAY_OVERRIDES]), use_tqdm=False)
    local_dir, ray_dir = tmp_path / "out-local", tmp_path / "out-ray"
    local_manifest = json.loads((local_dir / "manifest.json").read_text())
    ray_manifest = json.loads((ray_dir / "manifest.json").read_text())
    assert sorted(ray_manifest["shards"]) == sorted(local_manifest["shards"]) == ["part-0.parquet", "part-2.parquet"]
    assert list(ray_manifest["bad_shards"]) == ["part-1.parquet"]
    assert ray_manifest["bad_shards"] == local_manifest["bad_shards"]
    assert "reading failed after row 20" in ray_manifest["bad_shards"]["part-1.parquet"]["error"]
    local_summary = json.loads((local_dir / "summary.json").read_text())
    assert summary.data["bad_shards"] == local_summary["bad_shards"]
    assert summary.data["shards"] == local_summary["shards"] == {"committed_this_run": 2, "skipped": 0}
    assert summary.data["rows"]["total"] == local_summary["rows"]["total"] == 52
    assert temp_files(ray_dir) == []
    local_out, ray_out = read_outputs(local_dir), read_outputs(ray_dir)
    assert sorted(ray_out) == ["part-0.parquet", "part-2.parquet"]
    for name, table in ray_out.items():
        assert table.drop_columns(["usage"]).equals(local_out[name].drop_columns(["usage"])), name

    # A rerun does not read the bad shard again and still reports it, as a local rerun does.
    again = run_ray_job(load_job_config(job_file, ["output.path=out-ray", *RAY_OVERRIDES]), use_tqdm=False)
    assert again.data["shards"] == {"committed_this_run": 0, "skipped": 2}
    assert list(again.data["bad_shards"]) == ["part-1.parquet"]


def test_a_shard_unreadable_mid_read_stops_the_job_under_fail(
    ray_runtime: Any, model: Path, tmp_path: Path
) -> None:
    from batchgen.ray import run_ray_job

    job_file = three_shards(tmp_path, "fail", model)
    with pytest.raises(ShardReadError) as info:
        run_ray_job(load_job_config(job_file, RAY_OVERRIDES), use_tqdm=False)
    assert "part-1.parquet" in str(info.value) and "reading failed after row 20" in str(info.value)
    out_dir = tmp_path / "out"
    assert not (out_dir / "part-1.parquet").exists() and temp_files(out_dir) == []
    assert json.loads((out_dir / "manifest.json").read_text())["bad_shards"] == {}


@pytest.mark.slow  # a job run in a subprocess
def test_losing_the_nodes_ray_processes_ends_the_run_then_a_rerun_finishes(
    ray_runtime: Any, job: Job, tmp_path: Path
) -> None:
    """Defect 11, the incident: the driver (a subprocess with its own local Ray) loses its
    node's Ray processes (dashboard agent killed, the raylet shuts down with it) right after
    recording 2 of 6 shards. It must end at once with exit 1 and one message (the old driver
    waited forever for a replacement worker), and a rerun on another Ray completes the job."""
    pytest.importorskip("psutil")
    out_dir = job.folder / "out-lost"
    note = tmp_path / "lost.json"
    args = ["run", "job.yaml", "--quiet", "--threads", "1", "--set", "output.path=out-lost",
            "--set", "sampling.temperature=0"]
    env = {k: v for k, v in subprocess_env().items() if k != "RAY_ADDRESS"}  # its own Ray
    lost = subprocess.run(
        [sys.executable, str(LOSE_NODE), str(note), "2", *args], cwd=job.folder, env=env,
        capture_output=True, text=True, timeout=240, check=False,
    )
    struck = json.loads(note.read_text())
    assert len(struck["recorded"]) == 2 and struck["killed"], struck
    assert lost.returncode == 1, lost.stderr
    errors = [line for line in lost.stderr.splitlines() if line.startswith("error: ")]
    committed = json.loads((out_dir / "manifest.json").read_text())["shards"]
    assert errors == [
        "error: the Ray cluster can no longer run this job: no node of the Ray cluster is alive; "
        f"{len(committed)} of {NUM_SHARDS} shards are committed in {out_dir} and stay so; "
        "run the job again to resume"
    ], lost.stderr
    assert len(committed) >= 2 and temp_files(out_dir) == []
    before = {name: file_state(out_dir / name) for name in committed}

    from batchgen.ray import run_ray_job

    summary = run_ray_job(job.config("out-lost", "greedy"), use_tqdm=False)
    skipped = summary.data["shards"]["skipped"]
    assert skipped >= len(committed)  # plus any shard renamed as the node went down
    assert skipped + summary.data["shards"]["committed_this_run"] == NUM_SHARDS
    assert {name: file_state(out_dir / name) for name in committed} == before
    assert_same_output(job, out_dir, "greedy")
