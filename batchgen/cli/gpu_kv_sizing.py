"""The KV sizing figures of `batchgen gpu-check`: what the engine's own CUDA sizing gives on the
device, without allocating that pool.

The engine sizes its pool from `gpu_memory_utilization` of the device (0.9 by default): on an
H200, hundreds of thousands of blocks for a 135M model, each a Python object in the block pool.
The check's own engines use a capped pool (`--max-kv-blocks`); this module reports the uncapped
figures, so the sizing is still seen on real hardware.

Imports torch and the engine and models layers (cli layer).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from batchgen.engine.config import CacheConfig, SchedulerConfig
from batchgen.engine.kv_sizing import profile_cuda_kv_blocks
from batchgen.engine.llm_engine import resolve_dtype
from batchgen.engine.runner import ModelRunner
from batchgen.models.checkpoint import load_checkpoint
from batchgen.models.llama import LlamaModel
from batchgen.radix import KVCacheManager

__all__ = ["kv_sizing_figures"]

_ENGINE_MAX_MODEL_LEN = 32768  # LLMEngine's cap on a model's own limit (llm_engine._max_model_len)


def kv_sizing_figures(
    model: str | None,
    *,
    dtype: str,
    sched: SchedulerConfig | None = None,
    cache: CacheConfig | None = None,
    max_model_len: int | None = None,
) -> dict[str, Any]:
    """What the engine's CUDA sizing (`gpu_memory_utilization` of the device, after a profiling
    step) gives for `model` in `dtype`, without allocating that pool: blocks, bytes per block,
    GiB, tokens, the seconds the profiling took and the seconds a Python block pool
    (KVCacheManager) of that many blocks takes to build. Needs CUDA; raises what the model
    raises. None takes the engine's defaults: SchedulerConfig(), CacheConfig(), and the model's
    own limit capped at 32768 for `max_model_len`, as the engine caps it."""
    sched = sched or SchedulerConfig()
    cache = cache or CacheConfig()
    block_size = cache.block_size
    checkpoint = load_checkpoint(model)
    if max_model_len is None:
        max_model_len = min(checkpoint.config.max_position_embeddings, _ENGINE_MAX_MODEL_LEN)
    device = torch.device("cuda")
    torch_dtype = resolve_dtype(dtype, device)
    free_before, total = torch.cuda.mem_get_info()
    llama = LlamaModel(
        checkpoint.config,
        checkpoint.weights,
        device=device,
        dtype=torch_dtype,
        max_model_len=max_model_len,
        attention_backend="triton",
    )
    start = time.perf_counter()
    num_blocks = profile_cuda_kv_blocks(llama, sched, cache, max_model_len=max_model_len)
    profile_s = time.perf_counter() - start
    block_bytes = ModelRunner.kv_bytes_per_block(llama, block_size)
    del llama
    torch.cuda.empty_cache()
    start = time.perf_counter()
    pool = KVCacheManager(num_blocks, block_size, enable_prefix_caching=True, hash_seed=0)
    pool_s = time.perf_counter() - start
    del pool
    return {
        "dtype": dtype,
        "max_model_len": max_model_len,
        "max_num_seqs": sched.max_num_seqs,
        "max_num_batched_tokens": sched.max_num_batched_tokens,
        "gpu_memory_utilization": cache.gpu_memory_utilization,
        "num_blocks": num_blocks,
        "bytes_per_block": block_bytes,
        "kv_gib": round(num_blocks * block_bytes / 2**30, 3),
        "kv_tokens": num_blocks * block_size,
        "profile_s": round(profile_s, 3),
        "block_pool_build_s": round(pool_s, 3),
        "mem_free_gib_before": round(free_before / 2**30, 3),
        "mem_total_gib": round(total / 2**30, 3),
    }
