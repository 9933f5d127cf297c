"""The run report: ``report.html`` with the timeline's figures, shards, errors and configuration.

Reads only files (a job's output folder) or plain values handed in (a benchmark's results);
draws with matplotlib on the Agg canvas; writes one self-contained HTML file (figures inlined as
PNG, no script, no network).

May import: batchgen.io, matplotlib, numpy, pyarrow. Never batchgen.job or batchgen.engine
(the CLI hands in what it needs).
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = ["ReportPaths", "write_bench_report", "write_job_report", "write_sweep_report"]

__getattr__ = lazy_getattr(
    __name__,
    {
        "ReportPaths": "job_report",
        "write_job_report": "job_report",
        "write_bench_report": "bench_report",
        "write_sweep_report": "bench_report",
    },
)
