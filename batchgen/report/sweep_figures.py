"""The sweep's figures: throughput against p99 time between tokens and against waiting time.

Input: the sweep's points (`batchgen bench --sweep`: mappings with `policy`, `max_num_seqs`,
`output_tokens_per_s`, `tbt_p99_s`, `queue_mean_s`). One line per policy through its points in
`max_num_seqs` order, each point annotated with its `max_num_seqs`. Output: `FigureImage`s whose
series are read back from the drawn lines (what is plotted, not a copy of the input).

May import: matplotlib, numpy, batchgen.report.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from batchgen.report.figures import FigureImage, Series

__all__ = ["sweep_figures"]

# (name, title, x key, x scale, x label)
_PANELS = (
    ("throughput_vs_tbt", "Throughput against p99 time between tokens", "tbt_p99_s", 1e3,
     "p99 time between tokens (ms)"),
    ("throughput_vs_wait", "Throughput against waiting time", "queue_mean_s", 1.0,
     "mean waiting time in the queue (s)"),
)


def sweep_figures(points: Sequence[Mapping[str, Any]]) -> list[FigureImage]:
    """The two figures; none without points."""
    if not points:
        return []
    policies = list(dict.fromkeys(str(p["policy"]) for p in points))
    figures = []
    for name, title, key, scale, xlabel in _PANELS:
        fig = Figure(figsize=(10.0, 4.0), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output tokens/s")
        ax.grid(True, alpha=0.3)
        for i, policy in enumerate(policies):
            mine = sorted((p for p in points if p["policy"] == policy), key=lambda p: int(p["max_num_seqs"]))
            x = [float(p[key]) * scale for p in mine]
            y = [float(p["output_tokens_per_s"]) for p in mine]
            ax.plot(x, y, marker="o", color=f"C{i % 10}", label=policy)
            for xi, yi, p in zip(x, y, mine, strict=True):
                ax.annotate(f"m={p['max_num_seqs']}", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.legend(loc="best", fontsize=9)
        series = tuple(
            Series(str(line.get_label()), np.asarray(line.get_xdata(), np.float64), np.asarray(line.get_ydata(), np.float64))
            for line in ax.lines
        )
        with tempfile.SpooledTemporaryFile(max_size=1 << 26) as handle:
            fig.savefig(handle, format="png")
            handle.seek(0)
            png = handle.read()
        figures.append(FigureImage(name, title, png, series))
    return figures
