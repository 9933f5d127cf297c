"""Configuration of the engine's layers: one frozen dataclass per layer.

`__post_init__` checks ranges and does no I/O. Values found at run time (the KV block count after
sizing, the EOS ids) travel as separate arguments and are never written back here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Batching", "CacheConfig", "RunnerConfig", "SchedulerConfig"]

Batching = Literal["continuous", "static"]


def _require_positive(owner: str, name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{owner}.{name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Token budget per step (None: unbounded), running-set size, batching mode.

    `admission_reserve_tokens`: a waiting sequence is admitted only while the free KV blocks
    still cover every running sequence's next this-many tokens (or up to its end, if nearer):
    the admission watermark that keeps a small pool from thrashing. 0 admits whenever the next
    chunk fits (and leaves running out of blocks to recompute preemption).
    """

    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = 2048
    batching: Batching = "continuous"
    admission_reserve_tokens: int = 128

    def __post_init__(self) -> None:
        reserve = self.admission_reserve_tokens
        if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
            raise ValueError(f"SchedulerConfig.admission_reserve_tokens must be an integer >= 0, got {reserve!r}")
        _require_positive("SchedulerConfig", "max_num_seqs", self.max_num_seqs)
        if self.max_num_batched_tokens is not None:
            _require_positive("SchedulerConfig", "max_num_batched_tokens", self.max_num_batched_tokens)
        if self.batching not in ("continuous", "static"):
            raise ValueError(
                f"SchedulerConfig.batching must be 'continuous' or 'static', got {self.batching!r}"
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
        _require_positive("CacheConfig", "block_size", self.block_size)
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, int | float) or not 0 < util <= 1:
            raise ValueError(f"CacheConfig.gpu_memory_utilization must be in (0, 1], got {util!r}")
        if self.num_kv_blocks is not None:
            _require_positive("CacheConfig", "num_kv_blocks", self.num_kv_blocks)
        if self.kv_cache_memory_bytes is not None:
            _require_positive("CacheConfig", "kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        if not isinstance(self.enable_prefix_caching, bool):
            raise ValueError(
                f"CacheConfig.enable_prefix_caching must be a boolean, got {self.enable_prefix_caching!r}"
            )


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """Where and how the model runs. None picks a default for the device (float32 on CPU)."""

    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    attention_backend: Literal["torch", "triton", "cpu"] | None = None

    def __post_init__(self) -> None:
        if self.max_model_len is not None:
            _require_positive("RunnerConfig", "max_model_len", self.max_model_len)
        if self.dtype not in (None, "float32", "float16", "bfloat16"):
            raise ValueError(
                f"RunnerConfig.dtype must be float32, float16 or bfloat16, got {self.dtype!r}"
            )
        if self.attention_backend not in (None, "torch", "triton", "cpu"):
            raise ValueError(
                "RunnerConfig.attention_backend must be 'torch', 'triton' or 'cpu', "
                f"got {self.attention_backend!r}"
            )
