"""The report of `batchgen bench`: its modes side by side (a table of the figures, the engine
modes' timelines overlaid from zero), and the settings and machine of the run; and the page of
`batchgen bench --sweep` (`write_sweep_report`: the points' table, throughput against p99 time
between tokens and against waiting time).

May import: batchgen.io, batchgen.report, pyarrow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from batchgen.io import write_bytes_atomic
from batchgen.report.figures import make_figures, traces_from_timeline
from batchgen.report.html import Page, kv_table, pre_json, table

__all__ = ["write_bench_report", "write_sweep_report"]


def write_bench_report(
    path: Path,
    results: Sequence[Mapping[str, Any]],
    *,
    timeline: pa.Table | None,
    labels: Mapping[int, str],
    settings: Mapping[str, Any],
) -> Path:
    """Write the page to `path` atomically and return it.

    results: one mapping per mode (`BenchResult` fields); timeline: the engine modes' timelines
    with `run_index` keys into `labels` (None when no engine mode ran); settings: the bench's
    arguments and environment, shown as they are. Raises OSError when it cannot write.
    """
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    page = Page("batchgen bench report", f"written {now}")
    columns = ["mode", "wall_s", "num_requests", "prompt_tokens", "output_tokens",
               "output_tokens_per_s", "total_tokens_per_s", "num_steps", "prefill_tokens_computed",
               "cached_prompt_tokens", "num_preemptions", "peak_kv_blocks_used", "ttft_p99_s",
               "tbt_p99_s", "queue_mean_s"]
    page.section("Modes", table(columns, [[r.get(c) for c in columns] for r in results]))
    traces = traces_from_timeline(timeline, labels=dict(labels), back_to_back=False) if timeline is not None else []
    figures = make_figures(traces, ideal_hit_rate=None)
    if figures:
        page.section(
            "Timeline (engine modes overlaid from their start)",
            *(Page.figure(f.png, f.title) for f in figures),
        )
    else:
        page.section("Timeline", Page.text("No engine mode ran (no timeline).", note=True))
    scalars = [(k, v) for k, v in settings.items() if not isinstance(v, Mapping)]
    nested = {k: v for k, v in settings.items() if isinstance(v, Mapping)}
    page.section("Settings and machine", kv_table(scalars), *([pre_json(nested)] if nested else []))
    write_bytes_atomic(path, page.html().encode("utf-8"))
    return path


def write_sweep_report(path: Path, points: Sequence[Mapping[str, Any]], *, settings: Mapping[str, Any]) -> Path:
    """Write the sweep's page to `path` atomically and return it. points: one mapping per sweep
    point (`BenchResult` fields, `policy`, `max_num_seqs`). Raises OSError when it cannot write."""
    from batchgen.report.sweep_figures import sweep_figures

    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    clock = str(settings.get("clock", ""))
    page = Page("batchgen bench sweep" + (" (simulated)" if clock.startswith("simulated") else ""), f"written {now}")
    columns = ["policy", "max_num_seqs", "wall_s", "output_tokens_per_s", "total_tokens_per_s",
               "tbt_p50_s", "tbt_p99_s", "ttft_p99_s", "queue_mean_s", "queue_p99_s", "e2e_p99_s",
               "prefill_tokens_computed", "cached_prompt_tokens", "num_preemptions", "num_steps"]
    page.section("Points", table(columns, [[p.get(c) for c in columns] for p in points]))
    figures = sweep_figures(points)
    page.section("Throughput against latency", *(Page.figure(f.png, f.title) for f in figures))
    scalars = [(k, v) for k, v in settings.items() if not isinstance(v, Mapping)]
    nested = {k: v for k, v in settings.items() if isinstance(v, Mapping)}
    page.section("Settings", kv_table(scalars), *([pre_json(nested)] if nested else []))
    write_bytes_atomic(path, page.html().encode("utf-8"))
    return path
