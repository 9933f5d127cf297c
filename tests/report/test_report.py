"""`report.html` renders for a job with zero rows, only error rows, and preemptions; it is one
self-contained file; `batchgen report --format png` writes the figures; `report: false` skips it.

Jobs run in-process through `batchgen.cli.main.main` on one tiny model for the module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from tests.job.helpers import make_prompt_shards, write_job
from tests.report.helpers import PNG_MAGIC, assert_self_contained, images
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf_folder(tmp_path_factory.mktemp("tiny"), num_heads=4, num_kv_heads=2, hidden_size=64)


def _job(tmp: Path, model: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "model": str(model),
        "input": {"path": "in", "batch_rows": 8},
        "output": {"path": "out"},
        "sampling": {"max_tokens": 6, "temperature": 0.8},
        "engine": {"device": "cpu", "max_num_seqs": 8},
        "window_rows": 16,
        "max_error_rate": 1.0,
    }
    data.update(changes)
    return write_job(tmp / "job.yaml", data)


def _run(job: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["run", str(job), "--quiet", "--threads", "1"]) == 0
    return capsys.readouterr().out


def _timeline(out: Path) -> pa.Table:
    return pq.read_table(out / "timeline.parquet")


def test_report_for_a_job_with_zero_rows(tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": pa.array([], pa.int64()), "prompt": pa.array([], pa.string())}),
                   tmp_path / "in" / "part-0.parquet")
    printed = _run(_job(tmp_path, model_dir), capsys)
    out = tmp_path / "out"
    assert f"report                      {out / 'report.html'}" in printed
    page = (out / "report.html").read_text()
    assert_self_contained(page)
    assert images(page) == []
    assert "No engine step recorded" in page and "part-0.parquet" in page
    assert _timeline(out).num_rows == 0


def test_report_for_a_job_with_only_error_rows(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "in").mkdir()
    prompts = [None, "", None, "", None]
    pq.write_table(pa.table({"id": pa.array(range(5), pa.int64()), "prompt": pa.array(prompts, pa.string())}),
                   tmp_path / "in" / "part-0.parquet")
    _run(_job(tmp_path, model_dir), capsys)
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows"]["by_status"] == {"error": 5}
    timeline = _timeline(out)
    assert pc.sum(timeline["error_rows"]).as_py() == 5 and pc.sum(timeline["num_steps"]).as_py() == 0
    page = (out / "report.html").read_text()
    assert_self_contained(page)
    assert images(page) == []
    assert "No engine step recorded" in page
    # Errors by code, with example rows read back from the output shard.
    assert "invalid_prompt" in page and "the prompt is null" in page and "the prompt is empty" in page


def test_report_with_preemptions_and_png_figures(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_prompt_shards(tmp_path / "in", num_shards=2, rows_per_shard=12)
    # 24 blocks of 4 tokens for 8 sequences of ~40 tokens: the pool runs out and preempts.
    job = _job(
        tmp_path, model_dir,
        sampling={"max_tokens": 12, "temperature": 0.8},
        # admission_reserve_tokens 0: admit greedily, so the pool runs out and preempts
        engine={"device": "cpu", "max_num_seqs": 8, "block_size": 4, "num_kv_blocks": 24,
                "max_model_len": 96, "max_num_batched_tokens": 32, "admission_reserve_tokens": 0},
    )
    _run(job, capsys)
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["preemptions"] > 0
    assert pc.sum(_timeline(out)["preemptions"]).as_py() == summary["preemptions"]
    page = (out / "report.html").read_text()
    assert_self_contained(page)
    assert len(images(page)) == 4
    for title in ("Throughput over time", "Batch size and queue length", "KV pool use, preemptions marked",
                  "Prefix-cache hit rate"):
        assert title in page
    # The runs table shows the run's preemptions; the configuration section its fingerprint.
    runs = page[page.index("<h2>Runs</h2>"):page.index("<h2>Timeline</h2>")]
    assert f'<td class="num">{summary["preemptions"]}</td>' in runs
    assert "Fingerprint" in page and '&quot;num_kv_blocks&quot;: 24' in page and "torch threads" in page

    assert main(["report", str(out), "--format", "png"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0] == str(out / "report.html")
    pngs = sorted(Path(p).name for p in printed[1:])
    assert pngs == ["batch.png", "kv_pool.png", "prefix_hit_rate.png", "throughput.png"]
    for name in pngs:
        assert (out / "report_figures" / name).read_bytes().startswith(PNG_MAGIC)


def test_report_key_off_without_matplotlib_and_missing_folder(
    tmp_path: Path, model_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    make_prompt_shards(tmp_path / "in", num_shards=1, rows_per_shard=3)
    printed = _run(_job(tmp_path, model_dir, report=False), capsys)
    assert not (tmp_path / "out" / "report.html").exists() and "report.html" not in printed
    assert (tmp_path / "out" / "timeline.parquet").is_file()
    # Where the report cannot be imported (no matplotlib on a machine without network), the
    # finished job still exits 0 and says why there is no report.
    monkeypatch.setitem(sys.modules, "batchgen.report.job_report", None)
    printed = _run(_job(tmp_path, model_dir), capsys)
    assert "report                      not written" in printed
    assert not (tmp_path / "out" / "report.html").exists()
    monkeypatch.undo()
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "is not a folder" in capsys.readouterr().err
