"""Calibration: the cost-model coefficients of the machine a real run ran on (this CPU, or a GPU
whose bench files were copied here), fitted from the run's timeline.

Owns `calibrate`: each `timeline.parquet` row is an interval of steps with its work counts
(prefill and decode tokens, sampled tokens, sequences, attention pairs, context tokens read) and
its time. The time an interval stands for runs from its first step's start to the next
interval's (so the gaps between steps, the pipeline's own work, are in it):

    t_i = step_overhead_s * N_i + seq_overhead_s * R_i + (flops_i + attn_i) / F + bytes_i / B

with flops (the GEMMs'), attn (attention's) and bytes the cost model's (`batchgen.sim.cost`, the
run's model and dtype). The four coefficients are fitted by non-negative least squares over the
intervals (every subset of them, the best fit with all coefficients >= 0), and written as a
profile with both
efficiencies 1, `overlap: false` (the fitted times add), and the run's KV pool as
`kv_cache_bytes`. A coefficient fitted to 0 leaves that resource unlimited (a peak of 1e30).

Inputs: a job's output folder (`summary.json` names the model and the engine's dtype and KV
blocks) or a bench result (`bench.json` with its `bench.timeline.parquet`).

May import: batchgen.sim, numpy, pyarrow.
"""

from __future__ import annotations

import itertools
import json
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from batchgen.sim.cost import CostModel, ModelShape, StepWork
from batchgen.sim.hardware import HardwareProfile

__all__ = ["Calibration", "RunRecord", "calibrate", "fit_profile", "read_run"]

_UNLIMITED = 1e30
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class RunRecord:
    """What calibration reads of a run: its timeline's intervals and how it ran."""

    works: tuple[StepWork, ...]
    seconds: tuple[float, ...]
    model: str | None
    dtype_bytes: int
    num_kv_blocks: int
    block_size: int
    source: Path
    device: str = "cpu"  # the engine's device ("cpu", "cuda:0"); a CPU pool is committed on write


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted profile and how well it fits (`predicted_s` against `measured_s` in all)."""

    profile: HardwareProfile
    measured_s: float
    predicted_s: float
    r_squared: float
    num_intervals: int


def _dtype_bytes(text: str) -> int:
    name = text.rsplit(".", 1)[-1]
    if name not in _DTYPE_BYTES:
        raise ValueError(f"unknown engine dtype {text!r} in the run's summary")
    return _DTYPE_BYTES[name]


def read_run(path: Path) -> RunRecord:
    """A job's output folder or a bench JSON file, as intervals. Raises FileNotFoundError /
    ValueError naming the file."""
    if path.is_dir():
        summary_path, timeline_path = path / "summary.json", path / "timeline.parquet"
    else:
        summary_path, timeline_path = path, path.with_suffix(".timeline.parquet")
    for p in (summary_path, timeline_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: not found (calibration needs a run's summary.json and timeline.parquet)")
    summary: dict[str, Any] = json.loads(summary_path.read_text(encoding="utf-8"))
    run = summary.get("run") or summary.get("settings") or {}
    engine = run.get("engine", {})
    config = run.get("config", {})
    cache = config.get("cache", {}) if isinstance(config, dict) else {}
    model = run.get("model")
    if isinstance(model, str) and model.startswith("built-in"):
        model = None
    base_dir = config.get("base_dir") if isinstance(config, dict) else None
    if isinstance(model, str) and base_dir and not Path(model).expanduser().is_absolute():
        model = str(Path(base_dir) / model)  # a job file's model path is relative to its folder
    table = pq.read_table(timeline_path)
    if "attention_pairs" not in table.column_names:
        raise ValueError(f"{timeline_path}: written before the timeline held attention work; rerun the job")
    works, seconds = _intervals(table.to_pylist())
    if not works:
        raise ValueError(f"{timeline_path}: no interval with engine steps")
    return RunRecord(
        works=tuple(works),
        seconds=tuple(seconds),
        model=model,
        dtype_bytes=_dtype_bytes(str(engine.get("dtype", "float32"))),
        num_kv_blocks=int(engine.get("num_kv_blocks", 0)),
        block_size=int(cache.get("block_size", run.get("block_size", 16))),
        source=path,
        device=str(engine.get("device", "cpu")),
    )


def _intervals(rows: list[dict[str, Any]]) -> tuple[list[StepWork], list[float]]:
    """Work and time of each interval with steps; a run's last interval gets the mean gap
    between steps of the others added to its own span."""
    works: list[StepWork] = []
    seconds: list[float] = []
    by_run: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        by_run.setdefault(row["run_index"], []).append(row)
    for run_rows in by_run.values():
        stepped = sorted((r for r in run_rows if r["num_steps"] > 0), key=lambda r: r["t_start"])
        spans = [b["t_start"] - a["t_start"] for a, b in itertools.pairwise(stepped)]
        gaps = [(span - r["step_s"]) / r["num_steps"] for span, r in zip(spans, stepped, strict=False)]
        last = stepped[-1] if stepped else None
        if last is not None:
            mean_gap = max(0.0, float(np.mean(gaps))) if gaps else 0.0
            spans.append(last["t_end"] - last["t_start"] + mean_gap)
        for row, span in zip(stepped, spans, strict=True):
            works.append(
                StepWork(
                    num_steps=int(row["num_steps"]),
                    num_seqs=round(row["seqs_running"] * row["num_steps"]),
                    num_tokens=int(row["prefill_tokens"] + row["decode_tokens"]),
                    num_sampled=int(row["output_tokens"]),
                    context_tokens=int(row["context_tokens"]),
                    attention_pairs=int(row["attention_pairs"]),
                )
            )
            seconds.append(float(span))
    return works, seconds


def _nnls(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with every coefficient >= 0: the best of all column subsets' fits whose
    coefficients are all >= 0 (4 columns: 15 subsets)."""
    scale = np.maximum(np.abs(x).max(axis=0), 1e-300)
    xs = x / scale
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y**2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef, *_ = np.linalg.lstsq(xs[:, cols], y, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((xs[:, cols] @ coef - y) ** 2))
            if err < best_err:
                best_err = err
                best = np.zeros(x.shape[1])
                best[list(cols)] = coef
    result: np.ndarray = best / scale
    return result


def fit_profile(
    works: list[StepWork] | tuple[StepWork, ...],
    seconds: list[float] | tuple[float, ...],
    shape: ModelShape,
    *,
    dtype_bytes: int,
    kv_cache_bytes: float | None,
    name: str,
    device: str = "cpu",
    source: str | None = None,
) -> Calibration:
    """Fit the four coefficients to intervals (see the module docstring). Attention is priced at
    the GEMMs' rate: a separate attention rate fitted from the demo job swung from 40 to 11
    GFLOP/s between two runs of it (its prompts are short, so its attention pairs follow its
    prefill tokens) and mispredicted long-context work by up to +171%. `device`: the run's
    (a CPU run's KV pool is committed as blocks are written, a GPU's up front); `source`: the
    run, named in the profile's description."""
    unit = HardwareProfile(
        name=name, description="", peak_flops=1.0, memory_bandwidth=1.0, memory_bytes=1.0,
        compute_efficiency=1.0, memory_efficiency=1.0, step_overhead_s=0.0, seq_overhead_s=0.0,
        overlap=False, dtype_bytes=dtype_bytes,
    )
    cost = CostModel(shape, unit)
    x = np.array(
        [[w.num_steps, w.num_seqs, cost.flops(w) + cost.attention_flops(w), cost.bytes(w)] for w in works],
        dtype=np.float64,
    )
    y = np.array(seconds, dtype=np.float64)
    step, seq, per_flop, per_byte = (float(c) for c in _nnls(x, y))
    memory = kv_cache_bytes if kv_cache_bytes else 1.0
    profile = HardwareProfile(
        name=name,
        description=_description(device, source),
        peak_flops=1.0 / per_flop if per_flop > 0 else _UNLIMITED,
        memory_bandwidth=1.0 / per_byte if per_byte > 0 else _UNLIMITED,
        memory_bytes=float(memory),
        compute_efficiency=1.0,
        memory_efficiency=1.0,
        step_overhead_s=step,
        seq_overhead_s=seq,
        overlap=False,
        dtype_bytes=dtype_bytes,
        memory_utilization=1.0,
        kv_cache_bytes=kv_cache_bytes,
        kv_committed_on_write=device.split(":", 1)[0] == "cpu",
    )
    fitted = CostModel(shape, profile)
    predicted = np.array([fitted.seconds(w) for w in works])
    residual = float(np.sum((predicted - y) ** 2))
    total = float(np.sum((y - y.mean()) ** 2))
    return Calibration(
        profile=profile,
        measured_s=float(y.sum()),
        predicted_s=float(predicted.sum()),
        r_squared=1.0 - residual / total if total > 0 else 1.0,
        num_intervals=len(works),
    )


def calibrate(
    run: RunRecord | Sequence[RunRecord], shape: ModelShape, *, name: str = "calibrated"
) -> Calibration:
    """Fit a profile to `run` (one run, or several of the same model, dtype and device fitted as
    one set of intervals) for a model of `shape` (the runs' model).

    Several runs with different batch widths (`max_num_seqs`) let the fit tell a step's fixed cost
    from its per-token cost: in one run whose steps are nearly all as wide, the two move together
    and any split of them fits. The KV pool of the profile is the first run's. Raises ValueError
    for no runs, or runs of different models, dtypes or devices."""
    runs = (run,) if isinstance(run, RunRecord) else tuple(run)
    if not runs:
        raise ValueError("calibrate: no runs given")
    first = runs[0]
    for other in runs[1:]:
        theirs, ours = (other.model, other.dtype_bytes, other.device), (first.model, first.dtype_bytes, first.device)
        if theirs != ours:
            raise ValueError(
                f"calibrate: {other.source} ran {theirs[0]} ({theirs[1]}-byte numbers, {theirs[2]}), "
                f"{first.source} {ours[0]} ({ours[1]}-byte numbers, {ours[2]}): one profile is fitted to one model's runs"
            )
    block_bytes = shape.kv_bytes_per_token(first.dtype_bytes) * first.block_size
    kv_bytes = float(first.num_kv_blocks * block_bytes) if first.num_kv_blocks else None
    return fit_profile(
        [w for r in runs for w in r.works], [t for r in runs for t in r.seconds], shape,
        dtype_bytes=first.dtype_bytes, kv_cache_bytes=kv_bytes, name=name, device=first.device,
        source=", ".join(str(r.source) for r in runs),
    )


def _description(device: str, source: str | None) -> str:
    """Where the fitted run ran: this machine for a CPU run, else the device it names (a GPU
    run's files are calibrated wherever they were copied to)."""
    where = f"{platform.node() or 'this machine'} ({platform.processor() or platform.machine()})"
    if device.split(":", 1)[0] != "cpu":
        where = f"a {device} device"
    return f"calibrated on {where}" + (f" from {source}" if source else "")
