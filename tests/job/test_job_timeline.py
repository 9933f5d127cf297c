"""`timeline.parquet` of a job: its totals equal summary.json, its rows stay bounded, and a
`kill -9` then resume keeps both runs in a whole file.

The kill test runs the job in a subprocess through the kill wrapper of `tests/job/helpers.py`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from batchgen.job.timeline_file import timeline_schema
from tests.job.helpers import make_prompt_shards, run_cli_subprocess, temp_files, write_job
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _job(folder: Path, model: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "model": str(model),
        "input": {"path": "in", "batch_rows": 8},
        "output": {"path": "out"},
        "sampling": {"max_tokens": 8, "temperature": 0.8, "n": 2},
        "engine": {"device": "cpu", "max_num_seqs": 4},
        "window_rows": 16,
        "max_error_rate": 1.0,
    }
    data.update(changes)
    return write_job(folder / "job.yaml", data)


def _sum(table: pa.Table, column: str) -> int:
    return int(pc.sum(table[column]).as_py() or 0)


def _run_rows(table: pa.Table, run_index: int) -> pa.Table:
    return table.filter(pc.equal(table["run_index"], run_index))


def assert_totals_match(run: pa.Table, summary: dict[str, Any]) -> None:
    """The run's timeline sums equal its summary.json."""
    assert set(run["run_id"].to_pylist()) == {summary["run"]["run_id"]}
    by_status = summary["rows"]["by_status"]
    assert _sum(run, "ok_rows") == by_status.get("ok", 0)
    assert _sum(run, "error_rows") == by_status.get("error", 0)
    assert _sum(run, "output_tokens") == summary["tokens"]["output"]
    assert _sum(run, "prefill_tokens") == summary["tokens"]["prefill_computed"]
    assert _sum(run, "preemptions") == summary["preemptions"]
    assert int(pc.max(run["kv_blocks_used_max"]).as_py()) == summary["kv_blocks"]["peak_used"]


def test_timeline_totals_equal_summary_and_rows_stay_bounded(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_prompt_shards(tmp_path / "in", num_shards=2, rows_per_shard=20)
    # Two bad rows: error rows are counted in the timeline as the job emits them.
    pq.write_table(
        pa.table({"id": pa.array([5000, 5001], pa.int64()), "prompt": pa.array([None, ""], pa.string())}),
        tmp_path / "in" / "part-9.parquet",
    )
    job = _job(tmp_path, model_dir, timeline_rows=4)
    assert main(["run", str(job), "--quiet", "--threads", "1"]) == 0
    capsys.readouterr()
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    timeline = pq.read_table(out / "timeline.parquet")
    assert timeline.schema.equals(timeline_schema())
    assert summary["rows"]["by_status"] == {"ok": 40, "error": 2}
    assert summary["tokens"]["output"] == 40 * 2 * 8
    assert_totals_match(timeline, summary)
    # Many more steps than rows: at most timeline_rows closed rows plus the open one.
    assert _sum(timeline, "num_steps") > 20
    assert timeline.num_rows <= 5
    assert summary["run"]["run_index"] == 0 and summary["run"]["config"]["timeline_rows"] == 4
    assert summary["run"]["machine"]["torch_threads"] == 1


@pytest.mark.slow  # a job run in a subprocess
def test_kill_during_timeline_save_then_resume_keeps_both_runs(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_prompt_shards(tmp_path / "in", num_shards=3, rows_per_shard=16)
    _job(tmp_path, model_dir)
    run = ["run", "job.yaml", "--quiet", "--threads", "1"]
    # SIGKILL before the second rename onto timeline.parquet (the commit of the second shard):
    # its temporary file is written, the first save is the file.
    note = tmp_path / "note.json"
    killed = run_cli_subprocess(run, cwd=tmp_path, wrapper=[str(note), "timeline_rename", "2"])
    assert killed.returncode == -9, killed.stderr[-2000:]
    out = tmp_path / "out"
    assert any(p.name.startswith(".timeline.parquet.tmp-") for p in temp_files(out))
    first = pq.read_table(out / "timeline.parquet")  # whole: it reads back
    assert set(first["run_index"].to_pylist()) == {0}
    assert _sum(first, "ok_rows") >= 16  # at least the first committed shard's rows

    job = str(tmp_path / "job.yaml")
    assert main(["run", job, "--quiet", "--threads", "1"]) == 0
    assert temp_files(out) == []
    summary = json.loads((out / "summary.json").read_text())
    timeline = pq.read_table(out / "timeline.parquet")
    assert sorted(set(timeline["run_index"].to_pylist())) == [0, 1]
    assert len(set(timeline["run_id"].to_pylist())) == 2
    # Run 0 is kept as it was saved; run 1 is the resumed run and matches its summary.
    assert _run_rows(timeline, 0).equals(first)
    assert summary["run"]["run_index"] == 1
    assert_totals_match(_run_rows(timeline, 1), summary)
    assert _sum(_run_rows(timeline, 1), "ok_rows") == 16 * (3 - summary["shards"]["skipped"])
    # The report shows both runs.
    page = (out / "report.html").read_text()
    assert "<td>run 0</td>" in page and "<td>run 1</td>" in page

    # --restart drops the earlier runs.
    assert main(["run", job, "--quiet", "--threads", "1", "--restart"]) == 0
    capsys.readouterr()
    assert set(pq.read_table(out / "timeline.parquet")["run_index"].to_pylist()) == {0}
