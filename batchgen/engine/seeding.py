"""Deterministic seed derivation: a seed for every (job or engine seed, request, sample, step).

splitmix64 mixing, so nearby inputs give unrelated seeds and no global RNG state is involved.
"""

from __future__ import annotations

__all__ = ["derive_seed"]

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed that depends on every part, in order (parts may be any Python ints)."""
    state = 0x2545F4914F6CDD1D
    for part in parts:
        state = _splitmix64(state ^ (part & _MASK64))
    return state & ((1 << 63) - 1)
