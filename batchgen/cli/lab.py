"""The scheduling lab: drive an engine (real or simulated) through a workload and measure it.

Owns what `batchgen bench` and the simulator share:
- clocks: wall (`time.time`), CPU (`time.process_time`: this process's CPU seconds, steadier
  than wall time on a shared machine; offline only) and a simulation's clock;
- arrivals: offline (every request at once) or open-loop Poisson at `request_rate` requests/s
  (seeded exponential gaps), each request queued at its arrival time;
- `drive`: queue requests as they arrive, step the engine until all finish, collect outputs and
  each request's latency record (`RequestMetrics`: queue wait, TTFT, TBT, end to end);
- `latency_summary`: means and percentiles of those records (TBT over every gap, as vLLM's ITL);
- the sweep grid (`sweep_points`): static vs continuous batching, chunked prefill on and off,
  prefix caching on and off, at a few `max_num_seqs` each.

May import: batchgen.engine, batchgen.sim, numpy, tqdm.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from tqdm.auto import tqdm

from batchgen.engine.config import CacheConfig, SchedulerConfig
from batchgen.engine.llm_engine import LLMEngine
from batchgen.engine.outputs import RequestMetrics
from batchgen.engine.sampling_params import SamplingParams
from batchgen.sim.runner import SimClock

__all__ = [
    "CLOCKS",
    "Drive",
    "LabClock",
    "SweepPoint",
    "drive",
    "lab_clock",
    "latency_summary",
    "poisson_arrivals",
    "sweep_points",
]

CLOCKS = ("wall", "cpu")


class LabClock(Protocol):
    def now(self) -> float: ...

    def wait_until(self, t: float) -> None:
        """Return at `t` (or at once if it passed)."""
        ...


class _WallClock:
    def now(self) -> float:
        return time.time()

    def wait_until(self, t: float) -> None:
        delay = t - time.time()
        if delay > 0:
            time.sleep(delay)


class _CpuClock:
    def now(self) -> float:
        return time.process_time()

    def wait_until(self, t: float) -> None:
        raise ValueError("the CPU clock cannot wait for an arrival: use --clock wall with --request-rate")


class _SimLabClock:
    def __init__(self, clock: SimClock) -> None:
        self._clock = clock

    def now(self) -> float:
        return self._clock.now()

    def wait_until(self, t: float) -> None:
        self._clock.advance_to(t)


def lab_clock(kind: str, sim_clock: SimClock | None = None) -> LabClock:
    """A clock by name ("wall", "cpu"), or the simulation's when `sim_clock` is given."""
    if sim_clock is not None:
        return _SimLabClock(sim_clock)
    if kind == "wall":
        return _WallClock()
    if kind == "cpu":
        return _CpuClock()
    raise ValueError(f"unknown clock {kind!r}; choose from {', '.join(CLOCKS)}")


def engine_clock(kind: str) -> Callable[[], float]:
    """The engine's clock for a real run measured on `kind`."""
    return time.process_time if kind == "cpu" else time.time


def poisson_arrivals(num_requests: int, request_rate: float | None, *, seed: int = 0) -> list[float] | None:
    """Arrival offsets (seconds from the start) of a Poisson process at `request_rate` req/s;
    None (everything at once) for None or infinity."""
    if request_rate is None or math.isinf(request_rate):
        return None
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0, got {request_rate}")
    rng = random.Random(seed)
    t, times = 0.0, []
    for _ in range(num_requests):
        t += rng.expovariate(request_rate)
        times.append(t)
    return times


@dataclass(frozen=True, slots=True)
class Drive:
    """What `drive` collected: outputs and latency records by request index, and the time
    from the start to the last step's end on the clock."""

    outputs: dict[int, tuple[int, ...]]
    metrics: dict[int, RequestMetrics]
    wall_s: float


def drive(
    engine: LLMEngine,
    prompts: Sequence[list[int]],
    params: Sequence[SamplingParams],
    *,
    clock: LabClock,
    arrivals: Sequence[float] | None = None,
    use_tqdm: bool = False,
    desc: str = "",
) -> Drive:
    """Queue each request at its arrival (all at the start when `arrivals` is None), step until
    every one has finished. The engine's clock must be `clock`'s."""
    start = clock.now()
    order = deque(range(len(prompts)))
    index: dict[int, int] = {}
    outputs: dict[int, tuple[int, ...]] = {}
    metrics: dict[int, RequestMetrics] = {}
    bar = tqdm(total=len(prompts), desc=f"bench {desc}", unit="req", disable=not use_tqdm)
    while order or engine.has_unfinished():
        now = clock.now()
        while order and (arrivals is None or start + arrivals[order[0]] <= now):
            i = order.popleft()
            at = start if arrivals is None else start + arrivals[i]
            index[engine.add_request(list(prompts[i]), params[i], arrival_time=at)] = i
        if not engine.has_unfinished():
            assert arrivals is not None and order
            clock.wait_until(start + arrivals[order[0]])
            continue
        done = engine.step()
        for out in done:
            i = index.pop(out.request_id)
            outputs[i] = out.outputs[0].token_ids
            if out.metrics is not None:
                metrics[i] = out.metrics
        bar.update(len(done))
    bar.close()
    return Drive(outputs, metrics, clock.now() - start)


def latency_summary(metrics: Sequence[RequestMetrics]) -> dict[str, float]:
    """Seconds: queue wait, TTFT and end to end (mean, p50, p99 over requests), time between
    tokens (mean, p50, p99 over every gap of every request) and TPOT (mean of each request's
    mean gap). Zeros when there is nothing to measure."""

    def stats(name: str, values: Sequence[float] | np.ndarray) -> dict[str, float]:
        if len(values) == 0:
            return {f"{name}_mean_s": 0.0, f"{name}_p50_s": 0.0, f"{name}_p99_s": 0.0}
        a = np.asarray(values, dtype=np.float64)
        return {
            f"{name}_mean_s": round(float(a.mean()), 6),
            f"{name}_p50_s": round(float(np.percentile(a, 50)), 6),
            f"{name}_p99_s": round(float(np.percentile(a, 99)), 6),
        }

    gaps = [g for m in metrics for g in m.tbt_s]
    tpot = [sum(m.tbt_s) / len(m.tbt_s) for m in metrics if m.tbt_s]
    out = {
        **stats("queue", [m.queue_s for m in metrics]),
        **stats("ttft", [m.ttft_s for m in metrics]),
        **stats("tbt", gaps),
        **stats("e2e", [m.e2e_s for m in metrics]),
    }
    out["tpot_mean_s"] = round(float(np.mean(tpot)), 6) if tpot else 0.0
    return out


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One configuration of the sweep: its policy's name and the engine configs it runs."""

    policy: str
    max_num_seqs: int
    scheduler: SchedulerConfig
    cache: CacheConfig

    @property
    def label(self) -> str:
        return f"{self.policy} m={self.max_num_seqs}"


# policy -> (batching, chunked prefill, prefix caching)
SWEEP_POLICIES: dict[str, tuple[str, bool, bool]] = {
    "continuous": ("continuous", True, True),
    "no-chunked-prefill": ("continuous", False, True),
    "no-prefix-cache": ("continuous", True, False),
    "static": ("static", True, True),
}


def sweep_points(
    max_num_seqs: Sequence[int], *, max_num_batched_tokens: int | None, cache: CacheConfig
) -> list[SweepPoint]:
    """Every policy at every `max_num_seqs`, in that order."""
    points = []
    for m in max_num_seqs:
        for policy, (batching, chunked, prefix) in SWEEP_POLICIES.items():
            scheduler = SchedulerConfig(
                max_num_seqs=m,
                max_num_batched_tokens=max_num_batched_tokens,
                batching=batching,  # type: ignore[arg-type]
                enable_chunked_prefill=chunked,
            )
            points.append(SweepPoint(policy, m, scheduler, CacheConfig(
                block_size=cache.block_size,
                num_kv_blocks=cache.num_kv_blocks,
                kv_cache_memory_bytes=cache.kv_cache_memory_bytes,
                enable_prefix_caching=prefix,
                hash_seed=cache.hash_seed,
                gpu_memory_utilization=cache.gpu_memory_utilization,
            )))
    return points
