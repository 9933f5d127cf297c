"""The simulated runner and clock: what stands where `ModelRunner.execute` was.

Owns `SimClock` (seconds that move only when told) and `SimulatedRunner`, the engine's injected
runner (`LLMEngine(runner=..., clock=clock.now)`): each `execute(plan)` prices the plan's work
with the cost model, advances the clock by it and returns the sampled tokens from a token source
(`batchgen.sim.lengths`) as a `StepResult`. The engine's own scheduler, KV manager, radix cache,
timeline and latency records do everything else, so a simulation makes the same step sequence
as a real run; only the forward pass is replaced.

Also keeps the simulation's totals (steps, work, time by part) for the summary.

May import: batchgen.engine (the plan and result types), batchgen.sim.
"""

from __future__ import annotations

from dataclasses import dataclass

from batchgen.engine.step_plan import StepPlan, StepResult
from batchgen.sim.cost import CostModel, StepWork
from batchgen.sim.lengths import TokenSource

__all__ = ["SimClock", "SimTotals", "SimulatedRunner"]


class SimClock:
    """A clock in seconds that only `advance` and `advance_to` move."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go back ({seconds} s)")
        self._now += seconds

    def advance_to(self, t: float) -> None:
        """Move to `t` if it is later (an idle engine waiting for the next arrival)."""
        self._now = max(self._now, t)


@dataclass(slots=True)
class SimTotals:
    """Sums over the simulated steps (seconds and work counts)."""

    num_steps: int = 0
    overhead_s: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    busy_s: float = 0.0
    num_compute_bound_steps: int = 0
    tokens: int = 0
    sampled: int = 0
    context_tokens: int = 0
    attention_pairs: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__slots__}


class SimulatedRunner:
    """A runner without a model: cost model time on a clock, tokens from a token source."""

    def __init__(self, cost: CostModel, clock: SimClock, tokens: TokenSource) -> None:
        self.cost = cost
        self.clock = clock
        self.tokens = tokens
        self.totals = SimTotals()

    def execute(self, plan: StepPlan) -> StepResult:
        """Advance the clock by the plan's cost; one token per sample of each sampling chunk."""
        work = StepWork.of_plan(plan)
        cost = self.cost.cost(work)
        self.clock.advance(cost.total_s)
        t = self.totals
        t.num_steps += 1
        t.overhead_s += cost.overhead_s
        t.compute_s += cost.compute_s
        t.memory_s += cost.memory_s
        t.busy_s += cost.total_s - cost.overhead_s
        t.num_compute_bound_steps += cost.compute_s >= cost.memory_s
        t.tokens += work.num_tokens
        t.sampled += work.num_sampled
        t.context_tokens += work.context_tokens
        t.attention_pairs += work.attention_pairs
        token = self.tokens.token
        decodes = plan.decodes
        drawn = self.tokens.tokens(decodes.sample_seeds, decodes.num_generated_tokens)
        sampled: dict[int, tuple[int, ...]] = {}
        for c in plan.listed:
            if c.num_samples == 1:
                sampled[c.seq_id] = (token(c.sample_seeds[0], c.num_generated_tokens),)
            elif c.num_samples:
                sampled[c.seq_id] = tuple(token(seed, c.num_generated_tokens) for seed in c.sample_seeds)
        return StepResult(sampled=sampled, decode_tokens=drawn)
