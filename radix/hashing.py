"""Block hashing: the identity of a full KV block.

Owns the byte layout that is hashed, nothing else (no state).

A block's hash is xxh3_64, seeded with ``seed``, over::

    | parent_hash: u64 LE | extra_key: u64 LE | token_ids[0]: i64 LE | ... | token_ids[bs-1]: i64 LE |

so hashes chain: block i's hash depends on every token of blocks 0..i. ``ROOT_HASH`` is the parent
hash of a sequence's first block. Only full blocks are hashed. A 64-bit hash can collide, so a
user of these hashes must confirm a hit by comparing tokens (``RadixCache`` does).

Invariants: the same (parent_hash, token_ids, extra_key, seed) always gives the same hash, on any
host (token ids are written little-endian whatever the host byte order).

May import: the standard library and xxhash only.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Sequence

import xxhash

__all__ = ["ROOT_HASH", "block_hasher", "hash_block", "hash_blocks"]

ROOT_HASH: int = 0
"""Parent hash of the first block of every sequence."""

_UINT64_LIMIT = 1 << 64
_HEADER = struct.Struct("<QQ")  # parent_hash, extra_key
_TOKEN_TYPECODE = "q"  # int64
_IS_BIG_ENDIAN_HOST = sys.byteorder == "big"

if array(_TOKEN_TYPECODE).itemsize != 8:  # pragma: no cover - every CPython platform has 8
    raise ImportError("array('q') is not 8 bytes wide on this platform")


def _check_uint64(name: str, value: int) -> None:
    if not 0 <= value < _UINT64_LIMIT:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")


def _token_bytes(token_ids: Sequence[int]) -> bytes:
    """Token ids as consecutive int64 little-endian; OverflowError if one does not fit int64."""
    tokens = array(_TOKEN_TYPECODE, token_ids)
    if _IS_BIG_ENDIAN_HOST:  # pragma: no cover - CI hosts are little-endian
        tokens.byteswap()
    return tokens.tobytes()


def hash_block(
    parent_hash: int, token_ids: Sequence[int], extra_key: int = 0, seed: int = 0
) -> int:
    """Hash of one block of ``token_ids`` whose parent block hashed to ``parent_hash``.

    ``parent_hash``, ``extra_key`` and ``seed`` are unsigned 64-bit ints (ValueError otherwise);
    each token id must fit a signed int64 (OverflowError otherwise). Returns an unsigned 64-bit
    int. Does not check the number of tokens: callers hash full blocks only.
    """
    _check_uint64("parent_hash", parent_hash)
    _check_uint64("extra_key", extra_key)
    _check_uint64("seed", seed)
    data = _HEADER.pack(parent_hash, extra_key) + _token_bytes(token_ids)
    return xxhash.xxh3_64_intdigest(data, seed=seed)


def block_hasher(block_size: int, seed: int = 0) -> Callable[[int, Sequence[int], int], int]:
    """``hash_block`` with ``seed`` fixed, for a cache that hashes every full block it sees:
    ``hasher(parent_hash, token_ids, extra_key)`` packs the same bytes with one precompiled
    struct when ``token_ids`` holds ``block_size`` tokens, and otherwise (or for a value out of
    range, so that ``hash_block`` raises its error) calls ``hash_block``."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_uint64("seed", seed)
    pack = struct.Struct(f"<QQ{block_size}q").pack
    digest = xxhash.xxh3_64_intdigest

    def hasher(parent_hash: int, token_ids: Sequence[int], extra_key: int = 0) -> int:
        try:
            data = pack(parent_hash, extra_key, *token_ids)
        except struct.error:
            return hash_block(parent_hash, token_ids, extra_key, seed)
        return digest(data, seed)

    return hasher


def hash_blocks(
    token_ids: Sequence[int], block_size: int, extra_key: int = 0, seed: int = 0
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (``len(token_ids) // block_size``).

    Equal to folding ``hash_block`` from ``ROOT_HASH``; the trailing partial block is not hashed.
    Raises ValueError for ``block_size < 1`` or out-of-range ``extra_key`` / ``seed``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    _check_uint64("extra_key", extra_key)
    _check_uint64("seed", seed)
    num_full_blocks = len(token_ids) // block_size
    data = _token_bytes(token_ids[: num_full_blocks * block_size])
    stride = 8 * block_size
    hashes: list[int] = []
    parent_hash = ROOT_HASH
    for block_idx in range(num_full_blocks):
        block_data = data[block_idx * stride : (block_idx + 1) * stride]
        parent_hash = xxhash.xxh3_64_intdigest(
            _HEADER.pack(parent_hash, extra_key) + block_data, seed=seed
        )
        hashes.append(parent_hash)
    return hashes
