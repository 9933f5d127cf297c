"""The simulator: a job's real rows through the engine's own scheduler and caches on a cost model.

Owns (one module each):
- ``hardware``: hardware profiles (built-in YAML package data in ``profiles/``, or a file);
- ``cost``: the cost model, a roofline of compute and memory time per step plus host overhead;
- ``lengths``: which token each simulated sample draws (max_tokens, a recorded run, a length
  distribution), so that output lengths decide when sequences stop;
- ``runner``: the simulated clock and the runner injected where `ModelRunner.execute` was;
- ``engine``: a model read without its weights and the `LLMEngine` built on the two above;
- ``job``: a whole job through its own pipeline on simulated engines (``--workers`` as Ray);
- ``calibrate``: this machine's profile fitted from a real run's timeline.

The simulator substitutes the runner, not the scheduler: the engine's `Scheduler`,
`KVCacheManager` and radix cache make every decision, so a simulated step sequence is a real
run's (tests/sim check it step for step).

May import: batchgen.job, batchgen.engine, batchgen.models, batchgen.tokenizer, batchgen.data,
batchgen.io, batchgen.radix. Never batchgen.cli, batchgen.ray or batchgen.report.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = [
    "CostModel",
    "HardwareProfile",
    "ModelShape",
    "SimClock",
    "SimulatedRunner",
    "StepWork",
    "build_sim_engine",
    "calibrate",
    "load_hardware",
    "load_sim_model",
    "simulate_job",
]

__getattr__ = lazy_getattr(
    __name__,
    {
        "CostModel": "cost",
        "ModelShape": "cost",
        "StepWork": "cost",
        "HardwareProfile": "hardware",
        "load_hardware": "hardware",
        "SimClock": "runner",
        "SimulatedRunner": "runner",
        "build_sim_engine": "engine",
        "load_sim_model": "engine",
        "calibrate": "calibrate",
        "simulate_job": "job",
    },
)
