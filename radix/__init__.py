"""batchgen.radix: KV block memory and prefix reuse, in plain Python over ints and tuples.

Owns (one module each):
- ``hashing``: the chained xxhash identity of a full block;
- ``block_pool``: ref counts and the O(1) LRU free queue of block ids;
- ``radix_cache``: the tree of cached full blocks, confirmed by tokens on every hit, and the
  cached block sharing the most leading tokens with a prompt past its full hits;
- ``kv_cache_manager``: block tables per sequence, the one object the scheduler talks to;
- ``prefix_order``: ordering prompts so that shared prefixes run together.

Each class has ``check_invariants()``, which raises AssertionError on a broken invariant.
Expected shortage (no free block) returns False or None; a caller error raises ValueError or
KeyError.

May import: the standard library and xxhash. Never torch, never another batchgen package.
"""

from __future__ import annotations

from .block_pool import BlockPool
from .hashing import ROOT_HASH, hash_block, hash_blocks
from .kv_cache_manager import BlockCopy, ForkResult, KVCacheManager
from .prefix_order import prefix_order, trie_token_count
from .radix_cache import CacheMatch, CacheStats, PartialMatch, RadixCache

__all__ = [
    "ROOT_HASH",
    "BlockCopy",
    "BlockPool",
    "CacheMatch",
    "CacheStats",
    "ForkResult",
    "KVCacheManager",
    "PartialMatch",
    "RadixCache",
    "hash_block",
    "hash_blocks",
    "prefix_order",
    "trie_token_count",
]
