"""Rotary embeddings: inverse frequencies for each scaling type, and the cos/sin tables the
kernels read.

`inv_freq` follows transformers' `modeling_rope_utils` functions operation for operation (float32
tensors, Python floats where transformers uses them), so tables match its to the last bit
(tests/models/test_rope_vs_transformers.py checks each type against transformers' own function
and rotary modules). Two scalings that transformers recomputes in the forward pass from the
longest position of that pass cannot follow a KV cache, whose keys were rotated in earlier steps;
here they are fixed at load from `max_model_len`, the longest sequence the engine will hold:

- "dynamic" (NTK): the base for a context of `max(max_model_len, original)` tokens. With
  `max_model_len` at most the original context (the config's `max_position_embeddings`), that is
  the unscaled base, as transformers uses for such sequences; the engine refuses a longer
  `max_model_len`, so its tables are always unscaled and dynamic scaling never extends a context
  here (vLLM instead uses one grown base for `max_position_embeddings * factor` at every length).
- "longrope": the long factors when `max_model_len` exceeds the original context, else the short
  ones (transformers switches per forward pass at the same length).

Tables are float32 `[max_model_len, head_dim // 2]` in "rotate half" form. With partial rotary
(`rotary_dim < head_dim`), transformers turns the first `rotary_dim` dimensions of each head and
passes the rest through; the kernels rotate whole heads, pairing dimension i with i + head_dim/2.
`partial_rotary_order` gives a reordering of each q/k head's dimensions (applied to the q/k
projection rows at load) under which transformers' pairs (i, i + rotary_dim/2) become the kernels'
pairs, and the table's extra columns hold cos 1, sin 0: the pass-through dimensions come out
unchanged, bit for bit. Scores are sums over dimensions, so q.k is unchanged by the reorder; V is
not reordered, so the attention output is the same.

Imports torch and `batchgen.models.config`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from batchgen.models.config import RopeScaling

__all__ = ["RotaryTable", "inv_freq", "partial_rotary_order", "rotary_table"]


class RotaryTable(NamedTuple):
    """cos and sin, float32 `[max_positions, head_dim // 2]` (attention factor included)."""

    cos: torch.Tensor
    sin: torch.Tensor


def _default(dim: int, base: float) -> torch.Tensor:
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3(dim: int, base: float, s: RopeScaling) -> torch.Tensor:
    inv = _default(dim, base)
    old_len = s.original_max_position_embeddings
    low_wavelen = old_len / s.low_freq_factor
    high_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _dynamic(dim: int, base: float, s: RopeScaling, max_model_len: int) -> torch.Tensor:
    original = s.original_max_position_embeddings
    seq_len = max(max_model_len, original)
    grown = base * ((s.factor * seq_len / original) - (s.factor - 1)) ** (dim / (dim - 2))
    return _default(dim, grown)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(dim: int, base: float, s: RopeScaling) -> tuple[torch.Tensor, float]:
    factor = s.factor
    attention_factor = s.attention_factor
    if attention_factor is None:
        if s.mscale and s.mscale_all_dim:
            attention_factor = float(_yarn_mscale(factor, s.mscale) / _yarn_mscale(factor, s.mscale_all_dim))
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (num_rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevents a division by zero
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv, attention_factor


def _longrope(dim: int, base: float, s: RopeScaling, max_model_len: int) -> tuple[torch.Tensor, float]:
    original = s.original_max_position_embeddings
    attention_factor = s.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if s.factor <= 1.0 else math.sqrt(1 + math.log(s.factor) / math.log(original))
    factors = s.long_factor if max_model_len > original else s.short_factor
    ext = torch.tensor(factors, dtype=torch.float32)
    shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (ext * base**shape), attention_factor


def inv_freq(
    rotary_dim: int, theta: float, scaling: RopeScaling | None, *, max_model_len: int
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies float32 `[rotary_dim // 2]`, attention factor scaling cos and sin)."""
    if scaling is None or scaling.rope_type == "default":
        return _default(rotary_dim, theta), 1.0
    kind = scaling.rope_type
    if kind == "linear":
        return _default(rotary_dim, theta) / scaling.factor, 1.0
    if kind == "llama3":
        return _llama3(rotary_dim, theta, scaling), 1.0
    if kind == "dynamic":
        return _dynamic(rotary_dim, theta, scaling, max_model_len), 1.0
    if kind == "yarn":
        return _yarn(rotary_dim, theta, scaling)
    if kind == "longrope":
        return _longrope(rotary_dim, theta, scaling, max_model_len)
    raise ValueError(f"unsupported rope_scaling type {kind!r}")


def rotary_table(
    head_dim: int,
    rotary_dim: int,
    theta: float,
    scaling: RopeScaling | None,
    *,
    max_model_len: int,
    device: torch.device,
) -> RotaryTable:
    """The cos/sin table of positions `0 .. max_model_len - 1` (module docstring)."""
    inv, attention_factor = inv_freq(rotary_dim, theta, scaling, max_model_len=max_model_len)
    freqs = torch.outer(torch.arange(max_model_len, dtype=torch.float32), inv)
    cos, sin = freqs.cos(), freqs.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    if rotary_dim < head_dim:
        pad = (head_dim - rotary_dim) // 2
        cos = torch.cat([cos, torch.ones(max_model_len, pad)], dim=1)
        sin = torch.cat([sin, torch.zeros(max_model_len, pad)], dim=1)
    return RotaryTable(cos.contiguous().to(device), sin.contiguous().to(device))


def partial_rotary_order(head_dim: int, rotary_dim: int) -> list[int]:
    """For each of the kernels' dimensions of a head, the transformers dimension it holds:

        transformers: | rot a | rot b | pass a | pass b |     (rot a, rot b) rotate together
        kernels:      | rot a | pass a | rot b | pass b |     (j, j + head_dim / 2) rotate together
    """
    half_rot, half_pass = rotary_dim // 2, (head_dim - rotary_dim) // 2
    rot_a = list(range(half_rot))
    rot_b = list(range(half_rot, rotary_dim))
    pass_a = list(range(rotary_dim, rotary_dim + half_pass))
    pass_b = list(range(rotary_dim + half_pass, head_dim))
    return rot_a + pass_a + rot_b + pass_b
