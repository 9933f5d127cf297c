"""Sizing the KV pool on CUDA from a share of the device's memory.

One forward pass of the largest step the scheduler may plan runs with a throwaway pool; what is
left of `gpu_memory_utilization` of the device after its peak (weights and activations) and the
memory outside torch's allocator becomes KV blocks.
"""

from __future__ import annotations

import torch

from batchgen.engine.config import CacheConfig, SchedulerConfig
from batchgen.engine.runner import ModelRunner
from batchgen.engine.step_plan import ScheduledChunk, StepPlan
from batchgen.models.llama import LlamaModel

__all__ = ["kv_blocks_from_memory", "profile_cuda_kv_blocks"]


def kv_blocks_from_memory(
    *, total_bytes: int, utilization: float, peak_bytes: int, non_torch_bytes: int, block_bytes: int
) -> int:
    """KV blocks that fit in `utilization` of the device once the profiled peak (weights and
    activations of a full step) and memory outside torch's allocator are set aside."""
    available = int(total_bytes * utilization) - peak_bytes - non_torch_bytes
    return max(0, available // block_bytes)


def profile_cuda_kv_blocks(
    model: LlamaModel, sched: SchedulerConfig, cache: CacheConfig, *, max_model_len: int
) -> int:
    """Run one forward pass of the largest step the scheduler may plan, with a throwaway pool,
    and size the KV pool from what is left of `gpu_memory_utilization` of the device."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    non_torch = (total - free) - torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    num_tokens = min(sched.max_num_batched_tokens or max_model_len, max_model_len * sched.max_num_seqs)
    num_seqs = max(1, min(sched.max_num_seqs, num_tokens))
    per_seq = max(1, min(num_tokens // num_seqs, max_model_len))
    blocks_per_seq = -(-per_seq // cache.block_size)
    runner = ModelRunner(model, num_blocks=num_seqs * blocks_per_seq, block_size=cache.block_size)
    chunks = tuple(
        ScheduledChunk(
            seq_id=s,
            token_ids=(0,) * per_seq,
            start_pos=0,
            block_table=tuple(range(s * blocks_per_seq, (s + 1) * blocks_per_seq)),
            num_samples=1,
        )
        for s in range(num_seqs)
    )
    runner.execute(StepPlan(chunks=chunks, block_copies=()))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    profile_kv = sum(k.numel() * k.element_size() * 2 for k, _ in runner.kv_caches)
    del runner
    torch.cuda.empty_cache()
    return kv_blocks_from_memory(
        total_bytes=total,
        utilization=cache.gpu_memory_utilization,
        peak_bytes=peak - profile_kv,
        non_torch_bytes=max(0, non_torch),
        block_bytes=ModelRunner.kv_bytes_per_block(model, cache.block_size),
    )
