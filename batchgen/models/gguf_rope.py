"""Rope scaling of a GGUF file, from llama.cpp's metadata keys and rope tensors.

As llama.cpp's converter stores it:
- llama3 (Llama 3.1+): a `rope_freqs` tensor of per-frequency divisors; the low/high frequency
  factors (1, 4) are Llama 3.1's, which GGUF does not carry, and the tensor is checked against
  them (another file is refused rather than run with other frequencies);
- LongRoPE (Phi-3): `rope_factors_long` / `rope_factors_short` tensors, one factor per rotary
  pair, the original context as `rope.scaling.original_context_length` (the scaling factor is
  `context_length` over it) and the attention factor as `rope.scaling.attn_factor`;
- linear: `rope.scaling.type` "linear" and `rope.scaling.factor`.
Any other `rope.scaling.type` (YaRN included) raises ValueError naming the file and the key.

Also `float32_decimal`: GGUF stores floats as float32, read back as the shortest decimal that
rounds to that float32 (1e-06, not 9.99999997e-07), which is the config.json value whenever
that one had at most seven significant digits, so configs compare equal.

Imports numpy, `batchgen.models.config` and `batchgen.models.gguf_tensors`; `gguf_config` only
for types.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from batchgen.models.config import RopeScaling
from batchgen.models.gguf_tensors import dequantize_tensor

if TYPE_CHECKING:
    from batchgen.models.gguf_config import GGUFMetadata

__all__ = ["float32_decimal", "llama3_freq_factors", "rope_scaling"]

_ROPE_FREQS = "rope_freqs.weight"
_ROPE_LONG = "rope_factors_long.weight"
_ROPE_SHORT = "rope_factors_short.weight"

# Llama 3.x rope-scaling constants that GGUF metadata does not carry; checked against rope_freqs.
_LLAMA3_LOW_FREQ_FACTOR = 1.0
_LLAMA3_HIGH_FREQ_FACTOR = 4.0
_LLAMA3_ORIGINAL_CONTEXT = 8192


def float32_decimal(value: Any) -> float:
    """A float32 value as the shortest decimal that rounds to it."""
    return float(str(np.float32(value)))


def _tensor_values(meta: GGUFMetadata, name: str) -> npt.NDArray[np.float32] | None:
    tensor = next((t for t in meta.reader.tensors if t.name == name), None)
    return None if tensor is None else dequantize_tensor(tensor, meta.path).reshape(-1)


def rope_scaling(
    meta: GGUFMetadata, *, rotary_dim: int, rope_theta: float, max_positions: int, tensors: set[str]
) -> RopeScaling | None:
    """The rope scaling of a file whose tensor names are `tensors` (module docstring); ValueError
    naming the file and the key or tensor for a type or shape batchgen does not run."""
    kind = meta.raw("rope.scaling.type")
    factor = meta.float_or_none("rope.scaling.factor")
    if _ROPE_FREQS in tensors:
        freqs = _tensor_values(meta, _ROPE_FREQS)
        assert freqs is not None
        return _llama3_scaling_from_freqs(meta, freqs, rotary_dim, rope_theta)
    if _ROPE_LONG in tensors or _ROPE_SHORT in tensors or kind == "longrope":
        return _longrope(meta, rotary_dim, max_positions)
    if kind in (None, "none") or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear" and factor is not None:
        return RopeScaling(rope_type="linear", factor=factor)
    raise ValueError(
        f"{meta.path}: {meta.arch}.rope.scaling.type {kind!r} is not supported (none, linear)"
    )


def _longrope(meta: GGUFMetadata, rotary_dim: int, max_positions: int) -> RopeScaling:
    """Phi-3's LongRoPE: per-pair factors as tensors, the original context as metadata."""
    long_factor, short_factor = _tensor_values(meta, _ROPE_LONG), _tensor_values(meta, _ROPE_SHORT)
    for name, values in ((_ROPE_LONG, long_factor), (_ROPE_SHORT, short_factor)):
        if values is None or values.shape != (rotary_dim // 2,):
            found = "missing" if values is None else f"of shape {values.shape}"
            raise ValueError(
                f"{meta.path}: longrope needs tensor {name} of ({rotary_dim // 2},), found {found}"
            )
    assert long_factor is not None and short_factor is not None
    original = meta.int_("rope.scaling.original_context_length")
    factor = max_positions / original
    # The converter stores transformers' derived attention factor; None keeps it derived (as
    # from config.json), an explicit value only when it differs.
    derived = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    stored = meta.float_or_none("rope.scaling.attn_factor")
    attention_factor = (
        None if stored is None or math.isclose(stored, derived, rel_tol=1e-6) else stored
    )
    return RopeScaling(
        rope_type="longrope",
        factor=factor,
        original_max_position_embeddings=original,
        attention_factor=attention_factor,
        long_factor=tuple(float32_decimal(x) for x in long_factor),
        short_factor=tuple(float32_decimal(x) for x in short_factor),
    )


def _llama3_scaling_from_freqs(
    meta: GGUFMetadata, freq_factors: npt.NDArray[np.float32], head_dim: int, rope_theta: float
) -> RopeScaling:
    """Recover llama3 rope parameters from llama.cpp's per-frequency divisors (`rope_freqs`)."""
    if freq_factors.shape != (head_dim // 2,):
        raise ValueError(
            f"{meta.path}: {_ROPE_FREQS} has shape {freq_factors.shape}, expected ({head_dim // 2},)"
        )
    original = meta.int_or_none("rope.scaling.original_context_length")
    scaling = RopeScaling(
        rope_type="llama3",
        factor=float(freq_factors.max()),
        low_freq_factor=_LLAMA3_LOW_FREQ_FACTOR,
        high_freq_factor=_LLAMA3_HIGH_FREQ_FACTOR,
        original_max_position_embeddings=original or _LLAMA3_ORIGINAL_CONTEXT,
    )
    expected = llama3_freq_factors(scaling, head_dim, rope_theta)
    if not np.allclose(expected, freq_factors, rtol=1e-4, atol=1e-6):
        raise ValueError(
            f"{meta.path}: {_ROPE_FREQS} does not match llama3 rope scaling with factor "
            f"{scaling.factor}; this rope scaling is not supported"
        )
    return scaling


def llama3_freq_factors(
    scaling: RopeScaling, head_dim: int, rope_theta: float
) -> npt.NDArray[np.float32]:
    """Divisor per rotary frequency (`inv_freq / scaled_inv_freq`), as llama.cpp stores it."""
    factors = np.empty(head_dim // 2, dtype=np.float32)
    low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
    for idx in range(head_dim // 2):
        wavelen = 2 * math.pi * rope_theta ** (2 * idx / head_dim)
        if wavelen < high_wavelen:
            factors[idx] = 1.0
        elif wavelen > low_wavelen:
            factors[idx] = scaling.factor
        else:
            smooth = (
                scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor
            ) / (scaling.high_freq_factor - scaling.low_freq_factor)
            factors[idx] = 1.0 / ((1 - smooth) / scaling.factor + smooth)
    return factors
