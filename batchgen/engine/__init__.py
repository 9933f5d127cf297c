"""The engine layer: one step = schedule, run the model, sample, update.

Owns the engine's configs, `LLMEngine`, sequences, the scheduler, the step plan types, the step
arrays, the model runner (with KV sizing), the sampler, seeding and the detokenizer.

May import: batchgen.models, batchgen.kernels, batchgen.radix, batchgen.tokenizer. Never
batchgen.job, batchgen.cli, batchgen.io.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = [
    "CacheConfig",
    "CompletionOutput",
    "EngineStats",
    "LLMEngine",
    "RequestOutput",
    "RunnerConfig",
    "SamplingParams",
    "ScheduledChunk",
    "Scheduler",
    "SchedulerConfig",
    "ScoreOutput",
    "StepPlan",
    "StepResult",
]

__getattr__ = lazy_getattr(
    __name__,
    {
        "CacheConfig": "config",
        "RunnerConfig": "config",
        "SchedulerConfig": "config",
        "CompletionOutput": "outputs",
        "RequestOutput": "outputs",
        "EngineStats": "llm_engine",
        "LLMEngine": "llm_engine",
        "SamplingParams": "sampling_params",
        "ScoreOutput": "scoring",
        "Scheduler": "scheduler",
        "ScheduledChunk": "step_plan",
        "StepPlan": "step_plan",
        "StepResult": "step_plan",
    },
)
