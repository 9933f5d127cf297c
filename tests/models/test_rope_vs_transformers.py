"""batchgen's rotary embeddings against transformers' own rope functions (issue 23).

For every rope type batchgen reads (default, linear, llama3, dynamic NTK, YaRN, LongRoPE) and
several parameter sets each (the configs of `real_configs/` as published, Qwen's documented YaRN
block, DeepSeek-style `mscale` / `mscale_all_dim`, gpt-oss-style `truncate: false`, Llama 3.2's
llama3 factors, Phi-3-128k-style LongRoPE without a `factor`), one config.json mapping is read
twice: by `ModelConfig.from_hf_dict` and by transformers' `AutoConfig`. Then

- the inverse frequencies of `rope.inv_freq` equal those of
  `transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]`, and the attention factor
  (the `attention_scaling` transformers multiplies cos and sin by: YaRN's mscale, LongRoPE's
  sqrt(1 + ln(factor) / ln(original))) equals the one it returns, both within 1e-6 relative;
- the cos/sin tables the model builds (`family.layer_rotary_tables`, one per layer, the ones the
  kernels read) equal, at positions from 0 to past the original context, what the model's own
  transformers rotary module (`LlamaRotaryEmbedding`, `Phi3RotaryEmbedding`, Gemma 3's per layer
  type, ...) returns for those positions, within 1e-6 (relative to the attention factor, the
  tables' scale). The module is called with the engine's longest position among the positions,
  so its per-forward switches (dynamic, longrope) see the sequence length the engine fixed its
  table for.

Two scalings transformers decides per forward pass from the longest position, while batchgen
fixes its table at load from `max_model_len` (its keys stay in the KV cache across steps):

- LongRoPE: short factors while `max_model_len <= original_max_position_embeddings`, long ones
  above, with the same attention factor both ways. transformers switches on the sequence length
  of each forward pass, so for a sequence shorter than the original context in an engine whose
  `max_model_len` exceeds it, batchgen rotates with the long factors and transformers with the
  short ones. (vLLM also picks once for the whole engine.)
- dynamic NTK: batchgen's base is the one for `max(max_model_len, max_position_embeddings)`
  tokens, and the engine refuses a `max_model_len` past `max_position_embeddings`
  (tests/job/test_job_errors.py, "max-model-len-over-model-limit"). So every table the engine
  builds is the unscaled one, which is what transformers uses for every sequence up to
  `max_position_embeddings` (checked here), and dynamic scaling never extends a context in
  batchgen. Past that length transformers grows the base with the length of each forward pass
  (re-rotating nothing already cached); `inv_freq` asked for such a length follows transformers'
  formula (checked, function level). vLLM differs from both: its dynamic NTK is one fixed table
  for `max_position_embeddings * factor` tokens, a grown base even for short sequences, so its
  outputs on sequences within `max_position_embeddings` differ from transformers'.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch

from batchgen.models.config import ModelConfig
from batchgen.models.family import BuildOptions, layer_rotary_tables
from batchgen.models.rope import inv_freq

CONFIGS = Path(__file__).parent / "real_configs"
RTOL = 1e-6


def _real(name: str, **changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / name).read_text())
    config.update(changes)
    return config


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    del config[key]
    return config


def _llama(rope: Mapping[str, Any] | None, *, head_dim: int = 128, theta: float = 10000.0, max_pos: int = 8192,
           **extra: Any) -> dict[str, Any]:  # fmt: skip
    """A Llama config.json of `head_dim`-wide heads with `rope` as its rope_scaling."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 1000,
        "hidden_size": 4 * head_dim, "intermediate_size": 256, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": head_dim,
        "max_position_embeddings": max_pos, "rope_theta": theta, "rope_scaling": rope, **extra,
    }  # fmt: skip


def _ramp(num: int, top: float) -> list[float]:
    """LongRoPE-like factors: 1 for the fastest pairs, growing to `top` for the slowest."""
    return [1.0 + (top - 1.0) * (i / (num - 1)) ** 2 for i in range(num)]


QWEN_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


class Case(NamedTuple):
    config: dict[str, Any]
    max_model_lens: tuple[int, ...]


CASES: dict[str, Case] = {
    # --- default (no scaling): the baseline the scaled types are measured from
    "default-smollm2-135m": Case(_real("smollm2-135m.json"), (8192,)),
    "default-phi3-mini-4k": Case(_real("phi-3-mini-4k-instruct.json"), (4096,)),
    "default-gemma3-local-and-global": Case(_real("gemma-3-1b-it.json"), (32768,)),
    # --- linear
    "linear-2": Case(_llama({"rope_type": "linear", "factor": 2.0}), (100, 16384)),
    "linear-4-theta1e6-d64": Case(_llama({"rope_type": "linear", "factor": 4.0}, head_dim=64, theta=1e6), (4096,)),
    # Gemma 3 4B/12B/27B: linear 8 on the global layers, the local layers' base unscaled.
    "linear-8-gemma3-global-only": Case(
        _real("gemma-3-1b-it.json", rope_scaling={"rope_type": "linear", "factor": 8.0}), (32768,)
    ),
    # --- llama3 (its four keys)
    "llama3-llama-3.1-8b": Case(_real("llama-3.1-8b-instruct.json"), (8192, 131072)),
    "llama3-llama-3.2": Case(
        _llama({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}, head_dim=64, theta=500000.0, max_pos=131072),
        (131072,),
    ),
    "llama3-16-low2-high8": Case(
        _llama({"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
                "original_max_position_embeddings": 4096}),
        (4096, 65536),
    ),
    "llama3-tiny-d16": Case(
        _llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}, head_dim=16, max_pos=2048),
        (2048,),
    ),
    # A top-level original_max_position_embeddings wins over the rope dict's in transformers.
    "llama3-top-level-original": Case(
        _llama({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256}, head_dim=64, max_pos=4096,
               original_max_position_embeddings=1024),
        (4096,),
    ),
    # --- dynamic NTK (lengths within max_position_embeddings; past it: the function-level test)
    "dynamic-2": Case(_llama({"rope_type": "dynamic", "factor": 2.0}, max_pos=2048), (1, 1000, 2048)),
    "dynamic-4-d64": Case(_llama({"rope_type": "dynamic", "factor": 4.0}, head_dim=64, max_pos=4096), (4096,)),
    # --- YaRN
    "yarn-qwen3-8b": Case(_real("qwen3-8b.json", rope_scaling=QWEN_YARN), (32768, 40960)),
    "yarn-qwen2.5-7b-legacy-type-key": Case(
        _real("qwen2.5-7b-instruct.json", rope_scaling={"type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 32768}),
        (32768,),
    ),
    "yarn-mscale-equal": Case(
        _llama({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}, head_dim=64, max_pos=163840),
        (4096, 163840),
    ),
    "yarn-mscale-0.707-all-dim-1": Case(
        _llama({"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
                "mscale_all_dim": 1.0}, head_dim=64, max_pos=163840),
        (163840,),
    ),
    "yarn-attention-factor-betas": Case(
        _llama({"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 2048,
                "attention_factor": 0.8, "beta_fast": 16.0, "beta_slow": 2.0}, max_pos=16384),
        (2048, 16384),
    ),
    "yarn-no-truncate": Case(
        _llama({"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096,
                "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}, head_dim=64, theta=150000.0,
               max_pos=131072),
        (131072,),
    ),
    "yarn-tiny-d32": Case(
        _llama({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, head_dim=32,
               max_pos=2048),
        (64, 2048),
    ),
    # --- LongRoPE: short factors up to the original context, long ones past it
    "longrope-phi-4-mini": Case(_real("phi-4-mini-instruct.json"), (4096, 4097, 131072)),
    "longrope-phi3-128k-style": Case(
        _real("phi-3-mini-4k-instruct.json", max_position_embeddings=131072,
              rope_scaling={"type": "longrope", "short_factor": _ramp(48, 1.1), "long_factor": _ramp(48, 40.0)}),
        (2048, 4096, 4097, 131072),
    ),
    # Phi-3's config class defaults a top-level original context to 4096, which wins over the
    # rope dict's (and over max_position_embeddings when neither is given).
    "longrope-phi3-default-top-level-original": Case(
        _without(_real("phi-4-mini-instruct.json", rope_scaling={
            "type": "longrope", "short_factor": _ramp(48, 1.2), "long_factor": _ramp(48, 20.0),
            "original_max_position_embeddings": 2048}), "original_max_position_embeddings"),
        (2048, 4096, 4097),
    ),
    "longrope-phi3-no-original-anywhere": Case(
        _without(_real("phi-4-mini-instruct.json"), "original_max_position_embeddings"), (4096, 4097),
    ),
    "longrope-explicit-factor-and-attention": Case(
        _real("phi-4-mini-instruct.json", rope_scaling={
            "rope_type": "longrope", "short_factor": _ramp(48, 1.5), "long_factor": _ramp(48, 16.0),
            "factor": 8.0, "attention_factor": 1.05}),
        (4096, 8192),
    ),
    "longrope-explicit-factor": Case(
        _real("phi-4-mini-instruct.json", rope_scaling={
            "rope_type": "longrope", "short_factor": _ramp(48, 1.0), "long_factor": _ramp(48, 16.0),
            "factor": 16.0}),
        (65536,),
    ),
}  # fmt: skip

LENGTH_CASES = [(name, length) for name, case in CASES.items() for length in case.max_model_lens]


def _ours(config: Mapping[str, Any]) -> ModelConfig:
    return ModelConfig.from_hf_dict(copy.deepcopy(dict(config)))


def _theirs(config: Mapping[str, Any]) -> Any:
    """transformers' config of the same mapping (a deep copy: transformers edits rope dicts)."""
    from transformers import AutoConfig

    d = copy.deepcopy(dict(config))
    return AutoConfig.for_model(d.pop("model_type"), **d)


def _rope_dict(hf_config: Any, layer_type: str | None) -> dict[str, Any]:
    params: dict[str, Any] = hf_config.rope_parameters
    return params[layer_type] if layer_type is not None else params


def _layer_type(hf_config: Any, layer_idx: int) -> str | None:
    """The key of transformers' rope parameters for a layer (Gemma 3 nests them per layer type)."""
    types = getattr(hf_config, "layer_types", None)
    return types[layer_idx] if types and types[layer_idx] in hf_config.rope_parameters else None


def _transformers_inv_freq(hf_config: Any, seq_len: int, layer_type: str | None = None) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope_type = _rope_dict(hf_config, layer_type)["rope_type"]
    kwargs = {} if layer_type is None else {"layer_type": layer_type}
    if rope_type == "default":
        module = _rotary_module(hf_config)
        inv, factor = type(module).compute_default_rope_parameters(hf_config, **kwargs)  # type: ignore[attr-defined]
    else:
        inv, factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), seq_len=seq_len, **kwargs)
    return inv.float(), float(factor)


def _rotary_module(hf_config: Any) -> torch.nn.Module:
    """The rotary embedding module the transformers model of `hf_config` builds."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(hf_config)]
    module = importlib.import_module(model_class.__module__)
    (rotary,) = [cls for name, cls in vars(module).items() if name.endswith("RotaryEmbedding")]
    built: torch.nn.Module = rotary(hf_config)
    return built


def _positions(max_model_len: int, original: int) -> torch.Tensor:
    """Positions below, at and past the original context, ending with the engine's last one."""
    picks = {0, 1, 2, 7, 63, 64, 1000, original - 1, original, original + 1, 2 * original, max_model_len // 2}
    picks.update(range(max(0, max_model_len - 4), max_model_len))
    return torch.tensor(sorted(p for p in picks if 0 <= p < max_model_len), dtype=torch.int64)


def _original(ours: ModelConfig) -> int:
    s = ours.rope_scaling
    return ours.max_position_embeddings if s is None else s.original_max_position_embeddings


@pytest.mark.parametrize(("name", "max_model_len"), LENGTH_CASES, ids=[f"{n}-{m}" for n, m in LENGTH_CASES])
def test_inverse_frequencies_and_attention_factor(name: str, max_model_len: int) -> None:
    config = CASES[name].config
    ours, theirs = _ours(config), _theirs(config)
    layer_types = {_layer_type(theirs, i) for i in range(ours.num_layers)}
    for layer_type in layer_types:
        is_local = layer_type == "sliding_attention"
        theta = ours.rope_local_theta if is_local and ours.rope_local_theta is not None else ours.rope_theta
        scaling = None if is_local and ours.rope_local_theta is not None else ours.rope_scaling
        inv, factor = inv_freq(ours.rotary_dim, theta, scaling, max_model_len=max_model_len)
        expected, expected_factor = _transformers_inv_freq(theirs, max_model_len, layer_type)
        assert inv.dtype == torch.float32 and inv.shape == expected.shape
        torch.testing.assert_close(inv, expected, rtol=RTOL, atol=0.0)
        assert factor == pytest.approx(expected_factor, rel=RTOL)


@pytest.mark.parametrize(("name", "max_model_len"), LENGTH_CASES, ids=[f"{n}-{m}" for n, m in LENGTH_CASES])
def test_cos_sin_tables_of_every_layer(name: str, max_model_len: int) -> None:
    config = CASES[name].config
    ours, theirs = _ours(config), _theirs(config)
    options = BuildOptions(device=torch.device("cpu"), dtype=torch.float32, max_model_len=max_model_len)
    tables = layer_rotary_tables(ours, options)
    module = _rotary_module(theirs)
    positions = _positions(max_model_len, _original(ours))
    half, half_rot = ours.head_dim // 2, ours.rotary_dim // 2
    x = torch.zeros(1, dtype=torch.float32)
    for idx, table in enumerate(tables):
        assert table is not None
        assert table.cos.shape == table.sin.shape == (max_model_len, half)
        layer_type = _layer_type(theirs, idx)
        args = () if layer_type is None else (layer_type,)
        cos, sin = (t[0] for t in module(x, positions[None], *args))
        # transformers' [.., rotary_dim] is (freqs, freqs): the kernels' table holds one half.
        torch.testing.assert_close(cos[:, :half_rot], cos[:, half_rot:], rtol=0.0, atol=0.0)
        scale = max(1.0, float(cos.abs().max()))
        for ours_t, theirs_t in ((table.cos, cos), (table.sin, sin)):
            torch.testing.assert_close(ours_t[positions, :half_rot], theirs_t[:, :half_rot], rtol=RTOL, atol=RTOL * scale)
        # Partial rotary: the pass-through pairs turn by 0 (cos 1, sin 0), unscaled.
        assert torch.equal(table.cos[:, half_rot:], torch.ones(max_model_len, half - half_rot))
        assert torch.equal(table.sin[:, half_rot:], torch.zeros(max_model_len, half - half_rot))


def test_the_cases_cover_every_rope_type_and_both_longrope_regimes() -> None:
    kinds = set()
    for case in CASES.values():
        ours = _ours(case.config)
        kinds.add("default" if ours.rope_scaling is None else ours.rope_scaling.rope_type)
    assert kinds == {"default", "linear", "llama3", "dynamic", "yarn", "longrope"}
    for name in ("longrope-phi-4-mini", "longrope-phi3-128k-style"):
        scaling = _ours(CASES[name].config).rope_scaling
        assert scaling is not None
        lengths = CASES[name].max_model_lens
        assert min(lengths) <= scaling.original_max_position_embeddings < max(lengths)

DYNAMIC = [name for name in CASES if name.startswith("dynamic")]


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_ntk_tables_the_engine_can_build_are_unscaled(name: str) -> None:
    """Every `max_model_len` the engine accepts (up to max_position_embeddings) gives the unscaled
    table, as transformers uses for sequences up to that length; vLLM's fixed table (the base
    for max_position_embeddings * factor tokens) is another one."""
    ours = _ours(CASES[name].config)
    scaling = ours.rope_scaling
    assert scaling is not None and scaling.rope_type == "dynamic"
    max_pos = ours.max_position_embeddings
    assert scaling.original_max_position_embeddings == max_pos
    for length in (1, 17, max_pos // 2, max_pos):
        inv, factor = inv_freq(ours.rotary_dim, ours.rope_theta, scaling, max_model_len=length)
        plain, _ = inv_freq(ours.rotary_dim, ours.rope_theta, None, max_model_len=length)
        assert torch.equal(inv, plain) and factor == 1.0
    vllm_like, _ = inv_freq(ours.rotary_dim, ours.rope_theta, scaling, max_model_len=int(max_pos * scaling.factor))
    assert float((vllm_like / plain).min()) < 0.9  # the slowest pairs turn markedly slower


@pytest.mark.parametrize("name", DYNAMIC)
def test_dynamic_ntk_past_max_position_embeddings_follows_transformers(name: str) -> None:
    """Function level (the engine never asks for these lengths): the base grown for a sequence
    of `length` tokens is transformers' for a forward pass of that length. Its rotary module
    computes that base from a tensor sequence length in float32 (here 2e-7 relative from the
    float64 base of its function with an int length, which batchgen matches exactly)."""
    config = CASES[name].config
    ours, theirs = _ours(config), _theirs(config)
    max_pos = ours.max_position_embeddings
    for length in (max_pos + 1, 2 * max_pos, 3 * max_pos + 17):
        inv, factor = inv_freq(ours.rotary_dim, ours.rope_theta, ours.rope_scaling, max_model_len=length)
        expected, expected_factor = _transformers_inv_freq(theirs, length)
        torch.testing.assert_close(inv, expected, rtol=RTOL, atol=0.0)
        assert factor == expected_factor == 1.0
        module = _rotary_module(theirs)
        module(torch.zeros(1), torch.arange(length)[None])  # grows its base for this length
        torch.testing.assert_close(inv, module.inv_freq, rtol=RTOL, atol=0.0)
        plain, _ = inv_freq(ours.rotary_dim, ours.rope_theta, None, max_model_len=length)
        assert not torch.equal(inv, plain)


def test_longrope_short_factors_up_to_the_original_context_long_past_it() -> None:
    """Phi-4-mini: original context 4096 of 131072, factor 32 (max / original), partial rotary
    0.75 (48 pairs of head_dim 128). The attention factor is sqrt(1 + ln 32 / ln 4096) both ways."""
    config = CASES["longrope-phi-4-mini"].config
    ours = _ours(config)
    scaling = ours.rope_scaling
    assert scaling is not None and scaling.rope_type == "longrope"
    assert (scaling.original_max_position_embeddings, ours.rotary_dim, scaling.factor) == (4096, 96, 32.0)
    shape = torch.arange(0, 96, 2, dtype=torch.int64).float() / 96
    for length, factors in ((4096, scaling.short_factor), (4097, scaling.long_factor), (131072, scaling.long_factor)):
        inv, factor = inv_freq(96, ours.rope_theta, scaling, max_model_len=length)
        expected = 1.0 / (torch.tensor(factors, dtype=torch.float32) * ours.rope_theta**shape)
        torch.testing.assert_close(inv, expected, rtol=RTOL, atol=0.0)
        assert factor == pytest.approx(math.sqrt(1 + math.log(32.0) / math.log(4096.0)), rel=RTOL)
    assert scaling.short_factor != scaling.long_factor


def test_longrope_with_a_long_engine_uses_the_long_factors_for_short_sequences_too() -> None:
    """The documented difference (module docstring): with max_model_len past the original
    context, a 100-token sequence is rotated with the long factors; transformers, running that
    sequence alone, uses the short ones."""
    config = CASES["longrope-phi-4-mini"].config
    ours, theirs = _ours(config), _theirs(config)
    options = BuildOptions(device=torch.device("cpu"), dtype=torch.float32, max_model_len=8192)
    (table, *_) = layer_rotary_tables(ours, options)
    assert table is not None
    cos, _ = (t[0] for t in _rotary_module(theirs)(torch.zeros(1), torch.arange(100)[None]))
    long_cos = _rotary_module(theirs)(torch.zeros(1), torch.arange(8192)[None])[0][0]
    half_rot = ours.rotary_dim // 2
    assert not torch.allclose(table.cos[:100, :half_rot], cos[:, :half_rot], atol=1e-3)
    torch.testing.assert_close(table.cos[:100, :half_rot], long_cos[:100, :half_rot], rtol=RTOL, atol=RTOL * 2)


@pytest.mark.parametrize(
    ("name", "attention_factor"),
    [
        ("yarn-qwen3-8b", 0.1 * math.log(4.0) + 1.0),
        ("yarn-mscale-equal", 1.0),
        ("yarn-mscale-0.707-all-dim-1", (0.1 * 0.707 * math.log(40.0) + 1.0) / (0.1 * math.log(40.0) + 1.0)),
        ("yarn-attention-factor-betas", 0.8),
        ("longrope-explicit-factor-and-attention", 1.05),
        ("longrope-explicit-factor", math.sqrt(1 + math.log(16.0) / math.log(4096.0))),
    ],
)
def test_attention_factor_values(name: str, attention_factor: float) -> None:
    """The factors written out (YaRN: 0.1 ln(s) + 1, or the mscale ratio; LongRoPE: sqrt(1 +
    ln(s) / ln(original))), so a change in both libraries at once does not pass unseen."""
    ours = _ours(CASES[name].config)
    _, factor = inv_freq(ours.rotary_dim, ours.rope_theta, ours.rope_scaling, max_model_len=ours.max_position_embeddings)
    assert factor == pytest.approx(attention_factor, rel=1e-12)
