"""The random-weight benchmark model (jobs/bench/random_model.py, issue 25): the llama-3.2-1b
shape's config and parameter count without writing weights; the tiny shape written to a folder
that batchgen and transformers both load, with the 128,256-id tokenizer, seeded weights, and the
same greedy tokens from batchgen's engine and transformers' LlamaForCausalLM; and the batchgen
command compare_vllm.py builds for such a folder."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import load_file

from batchgen import LLM, SamplingParams
from batchgen.models.checkpoint import expected_weight_shapes, load_checkpoint
from batchgen.models.config import ModelConfig, RopeScaling
from tests.tiny_models import smollm2_tokenizer

_BENCH = Path(__file__).resolve().parents[2] / "jobs" / "bench"
_LLAMA3_ROPE = RopeScaling(
    rope_type="llama3",
    factor=32.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=8192,
)
NEW_TOKENS = 8


def _load(name: str) -> ModuleType:
    """The script jobs/bench/NAME.py as module `bench_NAME` (registered: its dataclasses need it)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", _BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


random_model = _load("random_model")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("random-model") / "tiny"
    folder: Path = random_model.write_random_model(
        out, "tiny", seed=0, tokenizer=smollm2_tokenizer()
    )
    return folder


def test_llama_3_2_1b_config_has_its_numbers() -> None:
    config = random_model.hf_config("llama-3.2-1b", bos_token_id=1, eos_token_id=2)
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    widths = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                     "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size")}  # fmt: skip
    assert widths == {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
    }  # fmt: skip
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "float32"
    assert (config["rms_norm_eps"], config["rope_theta"], config["max_position_embeddings"]) == (
        1e-5,
        500000.0,
        131072,
    )
    assert config["rope_scaling"] == {
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }  # fmt: skip
    # embeddings 128256 x 2048, then per layer q 2048^2, k and v 512 x 2048, o 2048^2, MLP 3 x 8192 x 2048
    # and two norms; the final norm; tied: no lm_head
    per_layer = 2 * 2048 * 2048 + 2 * 512 * 2048 + 3 * 8192 * 2048 + 2 * 2048
    assert (
        random_model.num_parameters(config)
        == 128256 * 2048 + 16 * per_layer + 2048
        == 1_235_814_400
    )
    assert random_model.SHAPES["llama-3.2-1b"].weight_std == 0.02
    # batchgen reads the config as it is, and expects exactly the tensors the writer writes
    model_config = ModelConfig.from_hf_dict(config)
    assert model_config.rope_scaling == _LLAMA3_ROPE
    assert expected_weight_shapes(model_config) == random_model.weight_shapes(config)


def test_weights_come_from_the_seed(tmp_path: Path) -> None:
    shapes = {
        "model.embed_tokens.weight": (300, 64),
        "model.layers.0.input_layernorm.weight": (64,),
        "b": (64, 32),
    }
    paths = {}
    for name, seed in (("a", 0), ("again", 0), ("other", 1)):
        paths[name] = tmp_path / f"{name}.safetensors"
        random_model.write_safetensors(paths[name], shapes, seed=seed, std=0.02)
    assert paths["a"].read_bytes() == paths["again"].read_bytes()
    assert paths["a"].read_bytes() != paths["other"].read_bytes()
    header_len = int.from_bytes(paths["a"].read_bytes()[:8], "little")
    assert header_len % 8 == 0
    tensors = load_file(paths["a"])
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert all(t.dtype == torch.float32 for t in tensors.values())
    assert torch.equal(tensors["model.layers.0.input_layernorm.weight"], torch.ones(64))
    assert abs(float(tensors["model.embed_tokens.weight"].mean())) < 0.002
    assert math.isclose(float(tensors["model.embed_tokens.weight"].std()), 0.02, rel_tol=0.03)


def test_an_unrelated_folder_is_not_replaced(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match=r"holds other files \(notes.txt\)"):
        random_model.write_random_model(tmp_path, "tiny", tokenizer=smollm2_tokenizer())
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_tiny_folder_loads_in_batchgen_and_transformers(tiny_folder: Path) -> None:
    from transformers import AutoTokenizer

    assert sorted(p.name for p in tiny_folder.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    assert not tiny_folder.with_name("tiny.tmp").exists()
    checkpoint = load_checkpoint(tiny_folder)
    c = checkpoint.config
    assert (c.architecture, c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (
        "llama",
        128256,
        64,
        128,
        2,
    )
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.tie_word_embeddings) == (4, 2, 16, True)
    assert (c.rms_norm_eps, c.rope_theta, c.rope_scaling, c.max_position_embeddings) == (
        1e-5,
        500000.0,
        _LLAMA3_ROPE,
        131072,
    )
    assert (c.bos_token_id, c.eos_token_ids) == (1, (2,))
    assert json.loads((tiny_folder / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tokenizer, smollm2 = checkpoint.tokenizer, smollm2_tokenizer()
    assert tokenizer.vocab_size == 128256
    assert (
        (tokenizer.bos_token_id, tokenizer.eos_token_id)
        == (smollm2.bos_token_id, smollm2.eos_token_id)
        == (1, 2)
    )
    # the workloads' requests: same ids as the built-in tokenizer's, chat template included
    messages = [{"role": "user", "content": "Write a haiku about tokens and caches."}]
    assert tokenizer.encode_chat(messages) == smollm2.encode_chat(messages)
    reserved = "<|reserved_special_token_0|><|reserved_special_token_79103|>"
    assert tokenizer.decode([49152, 128255], skip_special_tokens=False) == reserved
    assert tokenizer.decode([49152, 128255, 28120]) == tokenizer.decode([28120])
    hf = AutoTokenizer.from_pretrained(tiny_folder)
    assert len(hf) == 128256
    assert (hf.bos_token_id, hf.eos_token_id) == (1, 2)
    assert hf.decode([49152, 128255]) == reserved
    assert hf.convert_tokens_to_ids("<|reserved_special_token_79103|>") == 128255


def test_greedy_tokens_equal_transformers(tiny_folder: Path) -> None:
    """The same greedy tokens from both engines, prompts and outputs across the padded ids."""
    from transformers import LlamaForCausalLM

    prompts = [smollm2_tokenizer().encode_chat([{"role": "user", "content": "Hello, who are you?"}]),
               [5, 49152, 60000, 128255, 700, 701], list(range(100, 140))]  # fmt: skip
    llm = LLM(str(tiny_folder), seed=0)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    ours = [list(out.outputs[0].token_ids) for out in llm.generate(prompts, params, use_tqdm=False)]
    model: torch.nn.Module = LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32)
    model.eval()
    theirs = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(NEW_TOKENS):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            theirs.append(ids[len(prompt) :])
    assert ours == theirs
    # the weights' gain makes the tokens depend on the context, not echo the prompt's last one
    assert len({t for row in ours for t in row}) > NEW_TOKENS
    assert any(t >= 49152 for row in ours for t in row)
    assert all(isinstance(text, str) for text in llm.tokenizer.decode_batch(ours))


def test_compare_vllm_passes_the_model_to_batchgen(tmp_path: Path) -> None:
    compare = _load("compare_vllm")
    base = ["--vllm-python", "py", "--model-dir", "hf"]
    args: argparse.Namespace = compare._parser().parse_args(base)
    cmd = compare._batchgen_command(tmp_path, "single-turn", "single-turn.r1", args, True)
    assert "--model" not in cmd and "--kv-cache-gib" not in cmd  # the built-in model, as before
    assert "--linear-dtype" not in cmd  # float32, as vLLM
    args = compare._parser().parse_args(
        [*base, "--batchgen-model", "hf", "--batchgen-kv-cache-gib", "4", "--batchgen-linear-dtype", "bfloat16"]
    )
    cmd = compare._batchgen_command(tmp_path, "single-turn", "single-turn.r2", args, False)
    assert cmd[cmd.index("--model") + 1] == "hf"
    assert cmd[cmd.index("--kv-cache-gib") + 1] == "4.0"
    assert cmd[cmd.index("--linear-dtype") + 1] == "bfloat16"
    assert cmd[cmd.index("--requests-in") + 1] == str(tmp_path / "single-turn.jsonl")
