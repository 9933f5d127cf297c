"""The report's figures, drawn with matplotlib's object API on the Agg canvas (no pyplot, no
process-wide backend switch, no display needed) and returned as PNG bytes.

Input: `RunTrace`s, one per run (a job's runs placed back to back on one time axis, or a
benchmark's modes overlaid from zero). Output: each figure's PNG and the `Series` it drew, read
back from the figure's artists after drawing (so tests compare what is plotted, not a copy). A row of the timeline is an interval; it is drawn at its
end time, and its rates divide by the time since the previous row's end (the first row of a
run: since its own start), so idle gaps between steps lower the rate as they should.

May import: matplotlib, numpy, pyarrow.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

__all__ = ["FigureImage", "RunTrace", "Series", "make_figures", "traces_from_timeline"]

_WIDTH_IN, _HEIGHT_IN, _DPI = 10.0, 3.2, 100
_RUN_GAP_S = 0.0


@dataclass(frozen=True, slots=True)
class RunTrace:
    """One run's timeline as arrays: `x` is each row's end in seconds on the report's axis,
    `dt` the seconds each row stands for; `columns` holds the timeline's numeric columns."""

    label: str
    start_s: float
    x: np.ndarray
    dt: np.ndarray
    columns: dict[str, np.ndarray]

    def col(self, name: str) -> np.ndarray:
        return self.columns[name]


@dataclass(frozen=True, slots=True)
class Series:
    """One labelled line or set of markers as drawn: `x` and `y` in data units (a horizontal
    reference line spans the axes, x = [0, 1] in axes units)."""

    label: str
    x: np.ndarray
    y: np.ndarray


@dataclass(frozen=True, slots=True)
class FigureImage:
    name: str  # file stem for --format png
    title: str
    png: bytes
    series: tuple[Series, ...]  # every labelled artist, in drawing order

    def get(self, label: str) -> Series:
        """The series drawn under `label`; raises KeyError when none or several are."""
        found = [s for s in self.series if s.label == label]
        if len(found) != 1:
            raise KeyError(f"figure {self.name!r}: {len(found)} series labelled {label!r}")
        return found[0]


class _Drawn(NamedTuple):
    png: bytes
    series: tuple[Series, ...]


def traces_from_timeline(
    table: pa.Table, *, labels: dict[int, str] | None = None, back_to_back: bool = True
) -> list[RunTrace]:
    """Split a timeline table (run_index + `TimelineRow` columns) into one trace per run, in
    run order. back_to_back: each run starts where the previous ended (a job's resumed runs);
    otherwise every run starts at 0 (a benchmark's modes, overlaid)."""
    if table.num_rows == 0:
        return []
    run_index = table.column("run_index").to_numpy()
    numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    data = {name: table.column(name).to_numpy().astype(np.float64) for name in numeric}
    traces = []
    offset = 0.0
    for run in sorted(set(run_index.tolist())):
        mask = run_index == run
        cols = {name: values[mask] for name, values in data.items()}
        order = np.argsort(cols["t_end"], kind="stable")
        cols = {name: values[order] for name, values in cols.items()}
        t0 = float(cols["t_start"][0])
        ends = cols["t_end"] - t0
        starts = np.concatenate([[0.0], ends[:-1]])
        dt = np.maximum(ends - starts, np.maximum(cols["step_s"], 1e-3))
        label = (labels or {}).get(int(run), f"run {int(run)}")
        traces.append(RunTrace(label, offset, ends + offset, dt, cols))
        if back_to_back:
            offset += float(ends[-1]) + _RUN_GAP_S
    return traces


def make_figures(traces: Sequence[RunTrace], *, ideal_hit_rate: float | None) -> list[FigureImage]:
    """The four timeline figures; none when no trace has an engine step."""
    if not any(t.col("num_steps").sum() > 0 for t in traces):
        return []
    drawn = [
        ("throughput", "Throughput over time", _throughput(traces)),
        ("batch", "Batch size and queue length", _batch(traces)),
        ("kv_pool", "KV pool use, preemptions marked", _kv(traces)),
        ("prefix_hit_rate", "Prefix-cache hit rate", _hit_rate(traces, ideal_hit_rate)),
    ]
    return [FigureImage(name, title, d.png, d.series) for name, title, d in drawn]


def _new_axes(title: str, ylabel: str) -> tuple[Figure, Axes]:
    fig = Figure(figsize=(_WIDTH_IN, _HEIGHT_IN), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_title(title, loc="left", fontsize=11)
    ax.set_xlabel("seconds since the first run started")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _mark_runs(ax: Axes, traces: Sequence[RunTrace]) -> None:
    # Resumed runs share the axis: a dotted line where each later run starts.
    starts = sorted({t.start_s for t in traces})
    for start in starts[1:]:
        ax.axvline(start, color="0.4", linestyle=":", linewidth=1)


def _png(fig: Figure) -> _Drawn:
    # In memory (a figure is tens of KB); `io.BytesIO` is out of reach of mypy, which reads
    # `io` as the repository's io/ folder.
    with tempfile.SpooledTemporaryFile(max_size=1 << 26) as handle:
        fig.savefig(handle, format="png")
        handle.seek(0)
        return _Drawn(handle.read(), _drawn_series(fig))


def _drawn_series(fig: Figure) -> tuple[Series, ...]:
    # Labels starting with "_" are matplotlib's unlabelled artists (the run markers).
    series = []
    for ax in fig.axes:
        for artist in [*ax.lines, *ax.collections]:
            label = str(artist.get_label())
            if label.startswith("_"):
                continue
            if isinstance(artist, Line2D):
                x, y = np.asarray(artist.get_xdata(), np.float64), np.asarray(artist.get_ydata(), np.float64)
            elif isinstance(artist, PathCollection):
                offsets = np.asarray(artist.get_offsets(), np.float64).reshape(-1, 2)
                x, y = offsets[:, 0], offsets[:, 1]
            else:
                continue
            series.append(Series(label, x, y))
    return tuple(series)


def _color(i: int) -> str:
    return f"C{i % 10}"


def _throughput(traces: Sequence[RunTrace]) -> _Drawn:
    # Prompt tokens come in bursts far above the output rate: they get their own axis.
    fig, ax = _new_axes("Throughput per interval: output (left), prompt (right)", "output tokens/s")
    right = ax.twinx()
    right.set_ylabel("prompt tokens/s (computed + cached)")
    many = len(traces) > 1
    lines = []
    for i, t in enumerate(traces):
        steps = t.col("num_steps") > 0  # a last row may only hold rows emitted after the steps
        out = (t.col("output_tokens") / t.dt)[steps]
        prompt = ((t.col("prefill_tokens") + t.col("cached_tokens")) / t.dt)[steps]
        suffix = f" ({t.label})" if many else ""
        lines += right.plot(t.x[steps], prompt, color=_color(2 * i + 1), label=f"prompt tok/s{suffix}", linewidth=0.8,
                            alpha=0.6)
        lines += ax.plot(t.x[steps], out, color=_color(2 * i), label=f"output tok/s{suffix}", linewidth=1.6)
    ax.set_zorder(right.get_zorder() + 1)  # the output line above the prompt bursts
    ax.patch.set_visible(False)
    _mark_runs(ax, traces)
    ax.set_ylim(bottom=0)
    right.set_ylim(bottom=0)
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="upper right", fontsize=8)
    return _png(fig)


def _batch(traces: Sequence[RunTrace]) -> _Drawn:
    fig, ax = _new_axes("Sequences in the batch and waiting (mean per interval)", "sequences")
    many = len(traces) > 1
    for i, t in enumerate(traces):
        steps = t.col("num_steps") > 0
        suffix = f" ({t.label})" if many else ""
        ax.plot(t.x[steps], t.col("seqs_running")[steps], color=_color(2 * i), label=f"batch size{suffix}")
        ax.plot(t.x[steps], t.col("seqs_waiting")[steps], color=_color(2 * i + 1), linestyle="--",
                label=f"queue length{suffix}")
    _mark_runs(ax, traces)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize=8)
    return _png(fig)


def _kv(traces: Sequence[RunTrace]) -> _Drawn:
    fig, ax = _new_axes("KV blocks (mean per interval; ▼ preemptions)", "blocks")
    many = len(traces) > 1
    top = 0.0
    for i, t in enumerate(traces):
        steps = t.col("num_steps") > 0
        suffix = f" ({t.label})" if many else ""
        ax.plot(t.x[steps], t.col("kv_blocks_used")[steps], color=_color(3 * i), label=f"used{suffix}")
        ax.plot(t.x[steps], t.col("kv_blocks_used_max")[steps], color=_color(3 * i), linewidth=0.8,
                alpha=0.5, label=f"used, max{suffix}")
        ax.plot(t.x[steps], t.col("kv_blocks_cached")[steps], color=_color(3 * i + 1), linestyle="--",
                label=f"in prefix cache{suffix}")
        top = max(top, float(t.col("kv_blocks_total").max()))
    for total in sorted({float(t.col("kv_blocks_total").max()) for t in traces}):
        ax.axhline(total, color="0.3", linestyle=":", linewidth=1, label=f"pool size ({total:,.0f})")
    # One set of markers over all runs: the intervals that preempted, above the pool line.
    hit_x = np.concatenate([t.x[t.col("preemptions") > 0] for t in traces])
    num_preemptions = sum(int(t.col("preemptions").sum()) for t in traces)
    if num_preemptions:
        ax.scatter(hit_x, np.full(hit_x.size, top * 1.02), marker="v", color="red", s=18, zorder=3,
                   label=f"preemptions ({num_preemptions})")
    _mark_runs(ax, traces)
    ax.set_ylim(0, top * 1.08 if top else 1)
    ax.legend(loc="lower right", fontsize=8, ncols=2)
    return _png(fig)


def _hit_rate(traces: Sequence[RunTrace], ideal: float | None) -> _Drawn:
    fig, ax = _new_axes("Prompt tokens served by the prefix cache", "hit rate")
    many = len(traces) > 1
    for i, t in enumerate(traces):
        cached, computed = t.col("cached_tokens"), t.col("prefill_tokens")
        prompt = cached + computed
        has = prompt > 0
        suffix = f" ({t.label})" if many else ""
        ax.plot(t.x[has], cached[has] / prompt[has], color=_color(2 * i), linewidth=0.8, alpha=0.6,
                label=f"per interval{suffix}")
        cum_prompt = np.cumsum(prompt)
        cum = np.divide(np.cumsum(cached), cum_prompt, out=np.zeros_like(cum_prompt), where=cum_prompt > 0)
        ax.plot(t.x[has], cum[has], color=_color(2 * i + 1), linewidth=1.6, label=f"cumulative{suffix}")
    if ideal is not None:
        ax.axhline(ideal, color="black", linestyle="--", linewidth=1, label=f"ideal ({ideal:.1%})")
    _mark_runs(ax, traces)
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)
