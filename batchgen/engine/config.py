"""Configuration of the engine's layers: one frozen dataclass per layer.

`__post_init__` checks ranges and does no I/O. Values found at run time (the KV block count after
sizing, the EOS ids) travel as separate arguments and are never written back here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from batchgen._checks import check_int

__all__ = [
    "ENGINE_OPTION_OWNERS",
    "Batching",
    "CacheConfig",
    "EngineConfigs",
    "RunnerConfig",
    "SchedulerConfig",
    "engine_configs",
]

Batching = Literal["continuous", "static"]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Token budget per step (None: unbounded), running-set size, batching mode.

    `admission_reserve_tokens`: a waiting sequence is admitted only while the free KV blocks
    still cover every running sequence's next this-many tokens (or up to its end, if nearer):
    the admission watermark that keeps a small pool from thrashing. 0 admits whenever the next
    chunk fits (and leaves running out of blocks to recompute preemption).

    `enable_chunked_prefill`: False computes each prompt's prefill in one step, as engines did
    before Sarathi-Serve: a prompt is admitted only whole, while it fits what is left of the
    token budget, and a step's first prompt always fits (a prompt longer than the budget runs
    as its step's only prefill, past the budget). True (the default) cuts prompts into chunks.
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = 2048
    batching: Batching = "continuous"
    admission_reserve_tokens: int = 128
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        check_int("SchedulerConfig.max_num_seqs", self.max_num_seqs, minimum=1)
        check_int("SchedulerConfig.admission_reserve_tokens", self.admission_reserve_tokens, minimum=0)
        if self.max_num_batched_tokens is not None:
            check_int("SchedulerConfig.max_num_batched_tokens", self.max_num_batched_tokens, minimum=1)
        if self.batching not in ("continuous", "static"):
            raise ValueError(
                f"SchedulerConfig.batching must be 'continuous' or 'static', got {self.batching!r}"
            )
        if not isinstance(self.enable_chunked_prefill, bool):
            raise ValueError(
                "SchedulerConfig.enable_chunked_prefill must be a boolean, "
                f"got {self.enable_chunked_prefill!r}"
            )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV cache geometry: block size in tokens, pool size (blocks or bytes), prefix caching."""

    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    enable_prefix_caching: bool = True
    hash_seed: int = 0
    gpu_memory_utilization: float = 0.9  # CUDA: share of the device's memory the engine may use

    def __post_init__(self) -> None:
        check_int("CacheConfig.block_size", self.block_size, minimum=1)
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
            raise ValueError(f"CacheConfig.gpu_memory_utilization must be in (0, 1], got {util!r}")
        if self.num_kv_blocks is not None:
            check_int("CacheConfig.num_kv_blocks", self.num_kv_blocks, minimum=1)
        if self.kv_cache_memory_bytes is not None:
            check_int("CacheConfig.kv_cache_memory_bytes", self.kv_cache_memory_bytes, minimum=1)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"CacheConfig.enable_prefix_caching must be a boolean, got {self.enable_prefix_caching!r}"
            )


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Where and how the model runs. None picks a default for the device (float32 on CPU).

    linear_dtype "bfloat16" (opt-in; CPU, float32 model): the linear layers take bfloat16 operands
    with float32 sums (batchgen's kernel where the CPU has AVX512-BF16, float32 result; else
    oneDNN's, result rounded to bfloat16 and widened), everything else stays float32; 1.7-2.5x
    faster projections on an AVX-512 CPU, at a relative error of about 3e-3 a product (greedy
    tokens can differ from float32's). None or "float32": in the model's dtype.
    """

    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    attention_backend: Literal["torch", "triton", "cpu"] | None = None
    linear_dtype: Literal["float32", "bfloat16"] | None = None

    def __post_init__(self) -> None:
        if self.max_model_len is not None:
            check_int("RunnerConfig.max_model_len", self.max_model_len, minimum=1)
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(
                f"RunnerConfig.dtype must be float32, float16 or bfloat16, got {self.dtype!r}"
            )
        if self.linear_dtype not in (None, "float32", "bfloat16"):
            raise ValueError(f"RunnerConfig.linear_dtype must be float32 or bfloat16, got {self.linear_dtype!r}")
        if self.attention_backend not in (None, "torch", "triton", "cpu"):
            raise ValueError(
                "RunnerConfig.attention_backend must be 'torch', 'triton' or 'cpu', "
                f"got {self.attention_backend!r}"
            )


@dataclass(frozen=True, slots=True)
class EngineConfigs:
    """The three engine configs, as `engine_configs` builds them from flat options."""

    scheduler: SchedulerConfig
    cache: CacheConfig
    runner: RunnerConfig


# The one list of engine options (the job file's `engine:` keys, `LLM(...)` and `generate(...)`
# keyword arguments): every field of the three configs, by owner.
ENGINE_OPTION_OWNERS: Mapping[str, type[SchedulerConfig | CacheConfig | RunnerConfig]] = {
    f.name: owner for owner in (SchedulerConfig, CacheConfig, RunnerConfig) for f in fields(owner)
}


def engine_configs(options: Mapping[str, Any]) -> EngineConfigs:
    """Split flat engine options (names of ENGINE_OPTION_OWNERS) into the three configs.

    Raises TypeError naming an unknown option, ValueError for a bad value.
    """
    unknown = sorted(set(options) - set(ENGINE_OPTION_OWNERS))
    if unknown:
        raise TypeError(
            f"unknown engine option(s) {', '.join(unknown)}; "
            f"engine options: {', '.join(sorted(ENGINE_OPTION_OWNERS))}"
        )

    def owned_by(owner: type) -> dict[str, Any]:
        return {k: v for k, v in options.items() if ENGINE_OPTION_OWNERS[k] is owner}

    return EngineConfigs(
        scheduler=SchedulerConfig(**owned_by(SchedulerConfig)),
        cache=CacheConfig(**owned_by(CacheConfig)),
        runner=RunnerConfig(**owned_by(RunnerConfig)),
    )
