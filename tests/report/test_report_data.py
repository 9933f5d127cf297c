"""The report shows what the job's files hold: each figure's drawn series equal the timeline's
columns (per run, runs back to back), their totals equal summary.json, and the tables equal the
timeline, the manifest and the summaries.

One real job on a tiny model, run twice (the second run adds an input shard, so the timeline
holds two runs): a tight KV pool makes it preempt, two null/empty prompts give error rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.cli.main import main
from batchgen.engine.timeline import TimelineRow
from batchgen.job.timeline_file import timeline_table
from batchgen.report.figures import FigureImage, make_figures, traces_from_timeline
from batchgen.report.job_files import load_job_files
from batchgen.report.job_report import render_job_report
from tests.job.helpers import make_prompt_shards, write_job
from tests.report.helpers import images, section_tables
from tests.tiny_models import make_tiny_hf_folder


@dataclass(frozen=True)
class Job:
    out: Path
    summaries: list[dict[str, Any]]  # summary.json after each run
    page: str
    figures: dict[str, FigureImage]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Job:
    tmp = tmp_path_factory.mktemp("job")
    model = make_tiny_hf_folder(tmp / "tiny", num_heads=4, num_kv_heads=2, hidden_size=64)
    (shard,) = make_prompt_shards(tmp / "in", num_shards=1, rows_per_shard=12)
    table = pq.read_table(shard)
    prompts = table.column("prompt").to_pylist()
    prompts[3], prompts[5] = None, ""
    pq.write_table(table.set_column(1, "prompt", pa.array(prompts, pa.string())), shard)
    data = {
        "model": str(model),
        "input": {"path": "in", "batch_rows": 8},
        "output": {"path": "out"},
        "sampling": {"max_tokens": 12, "temperature": 0.8},
        # 24 blocks of 4 tokens for 8 sequences of ~40 tokens: the pool runs out and preempts
        "engine": {"device": "cpu", "max_num_seqs": 8, "block_size": 4, "num_kv_blocks": 24,
                   "max_model_len": 96, "max_num_batched_tokens": 32, "admission_reserve_tokens": 0},
        "window_rows": 16,
        "max_error_rate": 1.0,
    }
    job_file = write_job(tmp / "job.yaml", data)
    out = tmp / "out"
    summaries = []
    for run in range(2):
        if run == 1:  # a second run, with one more shard to do
            (extra,) = make_prompt_shards(tmp / "more", num_shards=1, rows_per_shard=10, first_id=5000)
            extra.rename(tmp / "in" / "part-1.parquet")
        assert main(["run", str(job_file), "--quiet", "--threads", "1"]) == 0
        summaries.append(json.loads((out / "summary.json").read_text()))
    page, figures = render_job_report(load_job_files(out))
    return Job(out, summaries, page, {f.name: f for f in figures})


@dataclass(frozen=True)
class Run:
    """One run of timeline.parquet, rows in t_end order, and the report's axis as the test
    computes it: x = seconds since the first run started (runs back to back), dt = what each
    row stands for (since the previous row's end, at least the row's step time or 1 ms)."""

    index: int
    rows: list[dict[str, Any]]
    x: list[float]
    dt: list[float]

    def col(self, name: str) -> list[Any]:
        return [r[name] for r in self.rows]

    def total(self, name: str) -> int:
        return int(sum(self.col(name)))


def _runs(out: Path) -> list[Run]:
    return _runs_of(pq.read_table(out / "timeline.parquet"))


def _runs_of(table: pa.Table) -> list[Run]:
    rows = table.to_pylist()
    runs, offset = [], 0.0
    for index in sorted({r["run_index"] for r in rows}):
        mine = sorted((r for r in rows if r["run_index"] == index), key=lambda r: r["t_end"])
        ends = [r["t_end"] - mine[0]["t_start"] for r in mine]
        dt = [max(end - prev, max(r["step_s"], 1e-3)) for end, prev, r in zip(ends, [0.0, *ends[:-1]], mine, strict=True)]
        runs.append(Run(index, mine, [end + offset for end in ends], dt))
        offset += ends[-1]
    return runs


def _pick(values: list[Any], mask: list[bool]) -> list[Any]:
    return [v for v, keep in zip(values, mask, strict=True) if keep]


def _drawn(figure: FigureImage, label: str) -> tuple[list[float], list[float]]:
    series = figure.get(label)
    return series.x.tolist(), series.y.tolist()


def test_the_job_has_two_runs_preemptions_and_errors(job: Job) -> None:
    runs = _runs(job.out)
    assert [r.index for r in runs] == [0, 1]
    assert [s["preemptions"] > 0 for s in job.summaries] == [True, True]
    assert job.summaries[0]["rows"]["error_codes"] == {"invalid_prompt": 2}
    assert sorted(job.figures) == ["batch", "kv_pool", "prefix_hit_rate", "throughput"]


def test_timeline_figures_plot_the_timeline_columns(job: Job) -> None:
    _assert_figures_plot(job.figures, _runs(job.out))


def _assert_figures_plot(fig: dict[str, FigureImage], runs: list[Run]) -> None:
    for run in runs:
        suffix = f" (run {run.index})" if len(runs) > 1 else ""
        steps = [n > 0 for n in run.col("num_steps")]
        step_x = _pick(run.x, steps)
        out_rate = [n / dt for n, dt in zip(run.col("output_tokens"), run.dt, strict=True)]
        prompt_rate = [(p + c) / dt for p, c, dt in zip(run.col("prefill_tokens"), run.col("cached_tokens"), run.dt, strict=True)]
        assert _drawn(fig["throughput"], f"output tok/s{suffix}") == (step_x, _pick(out_rate, steps))
        assert _drawn(fig["throughput"], f"prompt tok/s{suffix}") == (step_x, _pick(prompt_rate, steps))
        for label, column in (("batch size", "seqs_running"), ("queue length", "seqs_waiting")):
            assert _drawn(fig["batch"], label + suffix) == (step_x, _pick(run.col(column), steps))
        for label, column in (("used", "kv_blocks_used"), ("used, max", "kv_blocks_used_max"),
                              ("in prefix cache", "kv_blocks_cached")):
            assert _drawn(fig["kv_pool"], label + suffix) == (step_x, _pick(run.col(column), steps))
        prompt = [p + c for p, c in zip(run.col("prefill_tokens"), run.col("cached_tokens"), strict=True)]
        has = [p > 0 for p in prompt]
        per_interval = [c / p for c, p in zip(run.col("cached_tokens"), prompt, strict=True) if p > 0]
        assert _drawn(fig["prefix_hit_rate"], f"per interval{suffix}") == (_pick(run.x, has), per_interval)
        cum_cached = cum_prompt = 0
        cumulative = []
        for c, p in zip(run.col("cached_tokens"), prompt, strict=True):
            cum_cached, cum_prompt = cum_cached + c, cum_prompt + p
            if p > 0:
                cumulative.append(cum_cached / cum_prompt)
        assert _drawn(fig["prefix_hit_rate"], f"cumulative{suffix}") == (_pick(run.x, has), cumulative)
    # The preemption markers: every interval that preempted, over all runs, on one series.
    hit_x = [x for run in runs for x, n in zip(run.x, run.col("preemptions"), strict=True) if n > 0]
    total = sum(run.total("preemptions") for run in runs)
    if total:
        assert _drawn(fig["kv_pool"], f"preemptions ({total})")[0] == hit_x
    else:
        assert not [s for s in fig["kv_pool"].series if s.label.startswith("preemptions")]
    pool = max(max(run.col("kv_blocks_total")) for run in runs)
    assert _drawn(fig["kv_pool"], f"pool size ({pool:,})")[1] == [pool, pool]


@st.composite
def _timelines(draw: st.DrawFn) -> pa.Table:
    """1-3 runs of 1-6 rows each, as `TimelineFile` writes them: some rows without a step (rows
    emitted after the last step), some without prompt tokens, gaps between rows."""
    rows: list[TimelineRow] = []
    run_index: list[int] = []
    t = 1000.0
    for run in range(draw(st.integers(1, 3))):
        t += draw(st.floats(0, 50))
        for _ in range(draw(st.integers(1, 6))):
            start = t + draw(st.floats(0, 2))
            t = start + draw(st.floats(0.001, 3))
            steps = draw(st.integers(0 if rows else 1, 3))  # at least one step: else no figure
            count = st.integers(0, 40) if steps else st.just(0)
            rows.append(TimelineRow(
                t_start=start, t_end=t, num_steps=steps, step_s=draw(st.floats(0, 1)) if steps else 0.0,
                seqs_running=draw(st.floats(0, 8)), seqs_waiting=draw(st.floats(0, 8)),
                prefill_tokens=draw(count), decode_tokens=draw(count), cached_tokens=draw(count),
                output_tokens=draw(count), kv_blocks_used=draw(st.floats(0, 24)),
                kv_blocks_used_max=draw(st.integers(0, 24)), kv_blocks_cached=draw(st.floats(0, 24)),
                kv_blocks_free=0.0, kv_blocks_total=24, preemptions=draw(st.integers(0, 2)) if steps else 0,
                finished_requests=0, ok_rows=draw(st.integers(0, 3)), error_rows=0,
            ))
            run_index.append(run)
    tables = [timeline_table([r], run_id=f"r{i}", run_index=i) for r, i in zip(rows, run_index, strict=True)]
    return pa.concat_tables(tables)


@given(_timelines())
@settings(max_examples=10)
def test_figures_plot_the_columns_of_any_timeline(table: pa.Table) -> None:
    figures = {f.name: f for f in make_figures(traces_from_timeline(table), ideal_hit_rate=None)}
    _assert_figures_plot(figures, _runs_of(table))


def test_figure_totals_equal_each_runs_summary(job: Job) -> None:
    runs = _runs(job.out)
    fig = job.figures
    for run, summary in zip(runs, job.summaries, strict=True):
        suffix = f" (run {run.index})"
        # Rates times the seconds they stand for give back the summary's token counts.
        _, out_rate = _drawn(fig["throughput"], f"output tok/s{suffix}")
        step_dt = _pick(run.dt, [n > 0 for n in run.col("num_steps")])
        assert round(sum(r * dt for r, dt in zip(out_rate, step_dt, strict=True))) == summary["tokens"]["output"]
        assert run.total("output_tokens") == summary["tokens"]["output"]
        assert run.total("prefill_tokens") == summary["tokens"]["prefill_computed"]
        assert run.total("cached_tokens") == summary["tokens"]["cached"]
        assert run.total("preemptions") == summary["preemptions"]
        assert max(run.col("kv_blocks_used_max")) == summary["kv_blocks"]["peak_used"]
        by_status = summary["rows"]["by_status"]
        assert (run.total("ok_rows"), run.total("error_rows")) == (by_status.get("ok", 0), by_status.get("error", 0))
        # The cumulative hit rate ends at the run's cached / (cached + computed prompt tokens).
        tokens = summary["tokens"]
        cumulative = _drawn(fig["prefix_hit_rate"], f"cumulative{suffix}")[1]
        assert cumulative[-1] == tokens["cached"] / (tokens["cached"] + tokens["prefill_computed"])
    last = job.summaries[-1]
    total = last["kv_blocks"]["total"]
    assert _drawn(fig["kv_pool"], f"pool size ({total:,})")[1] == [total, total]
    ideal = last["prefix_hit_rate"]["ideal"]
    assert _drawn(fig["prefix_hit_rate"], f"ideal ({ideal:.1%})")[1] == [ideal, ideal]
    preemptions = sum(s["preemptions"] for s in job.summaries)
    assert fig["kv_pool"].get(f"preemptions ({preemptions})").x.size == sum(
        n > 0 for run in runs for n in run.col("preemptions")
    )


def _int(cell: str) -> int:
    return int(cell.replace(",", ""))


def test_tables_equal_the_timeline_manifest_and_summaries(job: Job) -> None:
    (runs_table,) = section_tables(job.page, "Runs")
    assert runs_table[0] == ["run", "started (UTC)", "duration s", "steps", "ok rows", "error rows",
                             "output tokens", "output tok/s", "preemptions", "timeline rows"]
    for row, run in zip(runs_table[1:], _runs(job.out), strict=True):
        assert row[0] == f"run {run.index}"
        assert [_int(c) for c in (row[3], row[4], row[5], row[6], row[8], row[9])] == [
            run.total("num_steps"), run.total("ok_rows"), run.total("error_rows"),
            run.total("output_tokens"), run.total("preemptions"), len(run.rows),
        ]

    shards_table = section_tables(job.page, "Shards")[0]
    manifest = json.loads((job.out / "manifest.json").read_text())["shards"]
    assert [row[0] for row in shards_table[1:]] == sorted(manifest) == ["part-0.parquet", "part-1.parquet"]
    for row in shards_table[1:]:
        record = manifest[row[0]]
        assert [_int(c) for c in row[1:8]] == [
            record["num_input_rows"], record["num_output_rows"], record["rows_by_status"].get("ok", 0),
            record["rows_by_status"].get("error", 0), record["prompt_tokens"], record["cached_tokens"],
            record["completion_tokens"],
        ]

    codes_table, examples_table = section_tables(job.page, "Errors")
    by_code: dict[str, int] = {}
    for summary in job.summaries:  # each shard is committed by one run: the runs' codes add up
        for code, n in summary["rows"]["error_codes"].items():
            by_code[code] = by_code.get(code, 0) + n
    assert {row[0]: _int(row[1]) for row in codes_table[1:]} == by_code == {"invalid_prompt": 2}
    assert sorted((row[0], row[1], row[4]) for row in examples_table[1:]) == [
        ("invalid_prompt", "part-0.parquet", "the prompt is empty"),
        ("invalid_prompt", "part-0.parquet", "the prompt is null"),
    ]

    (last_run,) = section_tables(job.page, "Last run")
    cells = dict((row[0], row[1]) for row in last_run)
    last = job.summaries[-1]
    assert cells["run id"] == last["run"]["run_id"]
    assert _int(cells["output tokens"]) == last["tokens"]["output"]
    assert _int(cells["prefill tokens computed"]) == last["tokens"]["prefill_computed"]
    assert _int(cells["preemptions"]) == last["preemptions"]
    assert cells["rows"] == f"{last['rows']['total']} (ok {last['rows']['by_status']['ok']})"


def test_the_page_shows_the_figures_whose_series_were_checked(job: Job) -> None:
    order = ["throughput", "batch", "kv_pool", "prefix_hit_rate"]
    assert images(job.page) == [job.figures[name].png for name in order]
