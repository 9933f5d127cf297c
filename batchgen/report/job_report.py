"""`batchgen report OUT_DIR`: ``OUT_DIR/report.html`` from the folder's files.

The page: the last run's summary, every run of the timeline, the four timeline figures, the
committed shards, errors by code with example rows, and the configuration, fingerprint, model,
versions and machine. Written atomically; ``--format png`` also writes each figure as
``OUT_DIR/report_figures/NAME.png``.

May import: batchgen.io, batchgen.report, matplotlib, pyarrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from batchgen.io import JobFolder, write_bytes_atomic
from batchgen.report.figures import FigureImage, RunTrace, make_figures, traces_from_timeline
from batchgen.report.html import Page, kv_table, pre_json, table
from batchgen.report.job_files import JobFiles, load_job_files

__all__ = ["ReportPaths", "render_job_report", "write_job_report"]


@dataclass(frozen=True, slots=True)
class ReportPaths:
    html: Path
    figures: tuple[Path, ...]


def write_job_report(out: Path | JobFolder, *, png: bool = False) -> ReportPaths:
    """Write the job folder's report (``OUT_DIR/report.html``, or the named output's
    ``results.jsonl.report.html``) and, when `png`, its figures. Raises FileNotFoundError /
    ValueError (see `load_job_files`; also a figures folder that is a symbolic link), OSError
    when it cannot write."""
    job = out if isinstance(out, JobFolder) else JobFolder(out)
    files = load_job_files(job)
    page, figures = render_job_report(files)
    path = job.report
    write_bytes_atomic(path, page.encode("utf-8"))
    written: list[Path] = []
    if png:
        folder = job.figures
        if folder.is_symlink():
            raise ValueError(f"{folder} is a symbolic link; batchgen writes its figures only into a folder of its own")
        folder.mkdir(exist_ok=True)
        for fig in figures:
            written.append(folder / f"{fig.name}.png")
            write_bytes_atomic(written[-1], fig.png)
    return ReportPaths(path, tuple(written))


def render_job_report(files: JobFiles) -> tuple[str, list[FigureImage]]:
    """The page's HTML and its figures."""
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    summary = files.summary or {}
    simulated = summary.get("simulated")
    page = Page("batchgen job report" + (" (simulated)" if simulated else ""), f"{files.out_dir} · written {now}")
    run = summary.get("run", {})
    ideal = summary.get("prefix_hit_rate", {}).get("ideal")
    traces = traces_from_timeline(files.timeline) if files.timeline is not None else []
    figures = make_figures(traces, ideal_hit_rate=ideal)

    if files.summary is None:
        page.section("Last run", Page.text("No summary.json: the job has not finished a run.", note=True))
    else:
        page.section("Last run", _summary_table(summary))
    if simulated:
        page.section("Simulated", *_simulated(simulated))
    page.section("Runs", *_runs(traces))
    if figures:
        page.section("Timeline", *(Page.figure(f.png, f.title) for f in figures))
    else:
        page.section(
            "Timeline",
            Page.text("No engine step recorded: the job had no rows, or only rows that failed before "
                      "reaching the engine.", note=True),
        )
    page.section("Shards", *_shards(files))
    page.section("Errors", *_errors(files))
    page.section("Configuration", *_configuration(files, run))
    return page.html(), figures


def _summary_table(d: dict[str, Any]) -> str:
    rows, tokens, rates = d.get("rows", {}), d.get("tokens", {}), d.get("tokens_per_s", {})
    hit, kv, shards = d.get("prefix_hit_rate", {}), d.get("kv_blocks", {}), d.get("shards", {})
    by_status = ", ".join(f"{k} {v:,}" for k, v in sorted(rows.get("by_status", {}).items())) or "none"
    return kv_table(
        [
            ("run id", d.get("run", {}).get("run_id", "")),
            ("wall time (s)", d.get("wall_s")),
            ("shards", f"{shards.get('committed_this_run', 0)} committed, {shards.get('skipped', 0)} already done"),
            ("rows", f"{rows.get('total', 0):,} ({by_status})"),
            ("prompt tokens", tokens.get("prompt")),
            ("cached prompt tokens", tokens.get("cached")),
            ("prefill tokens computed", tokens.get("prefill_computed")),
            ("output tokens", tokens.get("output")),
            ("output tokens/s", rates.get("output")),
            ("total tokens/s", rates.get("total")),
            ("preemptions", d.get("preemptions")),
            ("prefix hit rate", f"{hit.get('achieved', 0.0):.1%} (ideal {hit.get('ideal', 0.0):.1%})"),
            ("KV blocks", f"{kv.get('peak_used', 0):,} peak used of {kv.get('total', 0):,}"),
            *_structured_rows(d.get("structured_outputs", {})),
        ]
    )


def _structured_rows(counts: dict[str, Any]) -> list[tuple[str, Any]]:
    """Rows under structured_outputs: how many completed their grammar, how many max_tokens
    cut (none when the run constrained nothing)."""
    if not counts.get("constrained"):
        return []
    return [
        ("structured output rows", f"{counts['constrained']:,}"),
        ("completed their grammar", f"{counts.get('completed', 0):,}"),
        ("cut by length", f"{counts.get('cut_by_length', 0):,}"),
    ]


def _simulated(sim: dict[str, Any]) -> list[str]:
    """What a `batchgen simulate` summary says of how it was predicted."""
    hw = sim.get("hardware", {})
    return [
        Page.text("Predicted by batchgen simulate: no model ran; every time on this page comes from "
                  "the cost model on the hardware below.", note=True),
        kv_table([
            ("hardware", f"{hw.get('name', '?')} ({hw.get('description', '')})"),
            ("model priced", sim.get("model", "?")),
            ("output lengths", sim.get("output_lengths", "?")),
            ("workers", sim.get("workers") or 1),
            ("makespan (s)", sim.get("makespan_s")),
            ("simulated in (s)", sim.get("simulation_s")),
        ]),
    ]


def _runs(traces: Sequence[RunTrace]) -> list[str]:
    if not traces:
        return [Page.text("No timeline.parquet rows.", note=True)]
    rows = []
    for t in traces:
        start = datetime.fromtimestamp(float(t.col("t_start")[0]), UTC).strftime("%Y-%m-%d %H:%M:%S")
        duration = float(t.col("t_end")[-1] - t.col("t_start")[0])
        out = int(t.col("output_tokens").sum())
        rows.append([
            t.label, start, round(duration, 2), int(t.col("num_steps").sum()),
            int(t.col("ok_rows").sum()), int(t.col("error_rows").sum()), out,
            round(out / duration, 1) if duration > 0 else 0.0, int(t.col("preemptions").sum()),
            len(t.x),
        ])
    return [table(["run", "started (UTC)", "duration s", "steps", "ok rows", "error rows",
                   "output tokens", "output tok/s", "preemptions", "timeline rows"], rows)]


def _shards(files: JobFiles) -> list[str]:
    if not files.shards:
        return [Page.text("No committed shard.", note=True)]
    rows = []
    for name, r in sorted(files.shards.items()):
        rows.append([
            name, r.num_input_rows, r.num_output_rows, r.rows_by_status.get("ok", 0),
            r.rows_by_status.get("error", 0), r.prompt_tokens, r.cached_tokens, r.completion_tokens,
            r.wall_s,
        ])
    walls = np.array([r.wall_s for r in files.shards.values()])
    note = "time s: seconds from the shard's first row to its commit (0 when adopted from the file)"
    if walls.size > 1 and walls.max() > 0:
        note += f"; slowest {walls.max():.1f} s, median {float(np.median(walls)):.1f} s"
    return [table(["shard", "input rows", "output rows", "ok", "errors", "prompt tokens",
                   "cached tokens", "completion tokens", "time s"], rows), Page.text(note)]


def _errors(files: JobFiles) -> list[str]:
    if not files.error_codes:
        return [Page.text("No error rows in the committed shards.")]
    total = sum(files.error_codes.values())
    parts = [table(["code", "rows", "share of error rows"],
                   [[c, n, f"{n / total:.1%}"] for c, n in sorted(files.error_codes.items(), key=lambda kv: -kv[1])])]
    if files.error_examples:
        parts.append(table(["code", "shard", "id", "sample", "message"],
                           [[e.code, e.shard, e.row_id, e.sample_index, e.message] for e in files.error_examples]))
    return parts


def _configuration(files: JobFiles, run: dict[str, Any]) -> list[str]:
    parts = []
    versions, machine, engine = run.get("versions", {}), run.get("machine", {}), run.get("engine", {})
    gpu = machine.get("gpu")
    gpu_text = f"{gpu['name']} x{gpu['count']} ({gpu['memory_gib']} GiB)" if gpu else "none"
    parts.append(kv_table([
        ("model", run.get("model", "unknown")),
        ("device, dtype", f"{engine.get('device', '?')}, {engine.get('dtype', '?')}"),
        ("KV blocks", engine.get("num_kv_blocks", "?")),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items()) or "unknown"),
        ("CPU", f"{machine.get('cpu', '?')} ({machine.get('cpu_count', '?')} cores)"),
        ("torch threads", machine.get("torch_threads", "?")),
        ("GPU", gpu_text),
        ("platform", machine.get("platform", "?")),
    ]))
    if files.fingerprint is not None:
        parts += [Page.text("Fingerprint (manifest.json): what a resumed run must match."),
                  pre_json(files.fingerprint)]
    if "config" in run:
        parts += [Page.text("Job configuration of the last run (every key, defaults filled in)."),
                  pre_json(run["config"])]
    return parts
