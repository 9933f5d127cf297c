"""`batchgen simulate` end to end on a tiny model: a real run, its simulation, its calibration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from batchgen.cli.main import main
from batchgen.sim.hardware import load_hardware
from tests.job.helpers import make_prompt_shards, write_job
from tests.tiny_models import make_tiny_hf_folder


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny-model job, already run for real (out/), with `output.include_token_ids`."""
    tmp = tmp_path_factory.mktemp("simjob")
    model = make_tiny_hf_folder(tmp / "model", num_heads=4, num_kv_heads=2, hidden_size=64)
    make_prompt_shards(tmp / "data", num_shards=3, rows_per_shard=10)
    path = write_job(tmp / "job.yaml", {
        "model": str(model),
        "input": {"path": "data", "columns": {"id": "id", "prompt": "prompt"}},
        "output": {"path": "out", "include_token_ids": True},
        "sampling": {"max_tokens": 6, "temperature": 0.0},
        "engine": {"max_num_seqs": 4, "max_num_batched_tokens": 32, "device": "cpu", "max_model_len": 256},
        "report": False,
    })
    assert main(["run", str(path), "--quiet"]) == 0
    return path


def _keys(d: Any, prefix: str = "") -> set[str]:
    if not isinstance(d, dict):
        return set()
    return {f"{prefix}{k}" for k in d} | {k2 for k, v in d.items() for k2 in _keys(v, f"{prefix}{k}.")}


def test_a_simulation_writes_a_runs_files_marked_simulated(job: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sim"
    assert main(["simulate", str(job), "--hardware", "h100-sxm", "--outputs-from", str(job.parent / "out"),
                 "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "predicted wall time" in printed and "h100-sxm" in printed
    real = json.loads((job.parent / "out" / "summary.json").read_text())
    sim = json.loads((out / "summary.json").read_text())
    # the keys of a run's summary (not its machine description: nothing ran), plus `simulated`
    run_keys = {k for k in _keys(real) if not k.startswith(("run.versions", "run.machine"))}
    assert run_keys <= _keys(sim)
    assert sim["wall_s"] == sim["pipeline_s"] == round(sim["simulated"]["makespan_s"], 3) > 0
    # the same rows, tokens, cache hits and output lengths as the run it replays
    assert sim["rows"] == real["rows"] and sim["tokens"] == real["tokens"]
    assert sim["simulated"]["hardware"] == load_hardware("h100-sxm").as_dict()
    timeline = pq.read_table(out / "timeline.parquet")
    assert sum(timeline.column("output_tokens").to_pylist()) == real["tokens"]["output"]
    assert abs(max(timeline.column("t_end").to_pylist()) - min(timeline.column("t_start").to_pylist())
               - sim["pipeline_s"]) < 1e-3
    page = (out / "report.html").read_text()
    assert "<h1>batchgen job report (simulated)</h1>" in page and "<h2>Simulated</h2>" in page


def test_workers_share_the_shards_as_the_ray_driver_does(job: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    base = ["simulate", str(job), "--output-lens", "max-tokens", "--quiet", "--out"]
    assert main([*base, str(one)]) == 0
    assert main([*base, str(two), "--workers", "2"]) == 0
    single = json.loads((one / "summary.json").read_text())
    pair = json.loads((two / "summary.json").read_text())
    workers = pair["simulated"]["per_worker"]
    assert [w["shards"] for w in workers] == [2, 1]  # three shards, the first idle takes the next
    assert sum(w["rows"] for w in workers) == 30 == pair["rows"]["total"]
    assert pair["simulated"]["makespan_s"] == pytest.approx(max(w["finish_s"] for w in workers), abs=1e-6)
    assert pair["simulated"]["makespan_s"] < single["pipeline_s"]
    assert pq.read_table(two / "timeline.parquet").column("run_index").unique().to_pylist() == [0, 1]


def test_calibration_writes_a_profile_the_simulator_takes(job: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "here.yaml"
    assert main(["simulate", "--calibrate", str(job.parent / "out"), "--out", str(profile), "--name", "here"]) == 0
    first_out = capsys.readouterr().out
    assert "R^2" in first_out
    p = load_hardware(str(profile))
    assert (p.name, p.overlap, p.dtype_bytes) == ("here", False, 4)
    assert p.kv_cache_bytes is not None and p.kv_cache_bytes > 0
    out = tmp_path / "replay"
    assert main(["simulate", str(job), "--hardware", str(profile), "--outputs-from", str(job.parent / "out"),
                 "--out", str(out), "--quiet"]) == 0
    sim = json.loads((out / "summary.json").read_text())
    # in-sample: the run the profile was fitted on, replayed, takes about the time its engine steps
    # took, first step's start to last step's end (what the fit saw; the real run's pipeline_s also
    # holds its start-up before the first step, which on a loaded machine was half of this tiny
    # run's 0.07 s and failed a bound against pipeline_s)
    steps = [r for r in pq.read_table(job.parent / "out" / "timeline.parquet").to_pylist() if r["num_steps"] > 0]
    span = max(r["t_end"] for r in steps) - min(r["t_start"] for r in steps)
    assert 0.8 < sim["pipeline_s"] / span < 1.25
    # several runs fit as one set of intervals (here the same run twice: twice the intervals)
    twice = tmp_path / "twice.yaml"
    assert main(["simulate", "--calibrate", str(job.parent / "out"), str(job.parent / "out"), "--out", str(twice)]) == 0
    once_n, twice_n = (int(out.split(" intervals")[0].rsplit(" ", 1)[1]) for out in (first_out, capsys.readouterr().out))
    assert twice_n == 2 * once_n > 0


def test_bad_invocations_exit_2_with_one_message(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate"]) == 2
    assert main(["simulate", "--calibrate", str(job.parent / "out")]) == 2
    assert main(["simulate", str(job), "--hardware", "tpu-v9"]) == 2
    assert main(["simulate", str(job), "--workers", "0"]) == 2
    assert main(["simulate", "--calibrate", str(tmp_path), "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 5 and "tpu-v9" in err and "timeline.parquet" in err
