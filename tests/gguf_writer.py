"""Tiny models as llama.cpp would ship them: a Hugging Face folder, and a GGUF written from its
weights the way llama.cpp's converter (`convert_hf_to_gguf.py`) writes each architecture (helpers;
no tests in here).

`make_small_vocab_folder` writes a random tiny model of any supported architecture with
transformers, like `tests.tiny_models.make_tiny_hf_folder`, but with a small byte-level BPE
tokenizer (`SMALL_VOCAB_SIZE` tokens, trained here on a fixed text) instead of SmolLM2's 49152:
GGUF keeps the vocabulary as one metadata entry per token, and reading SmolLM2's back takes
seconds per file.

With `spm_model` the folder carries a SentencePiece vocabulary instead (`tokenizer.model` and the
`tokenizer.json` transformers converts from it), and `write_gguf` writes it as the converter's
`_set_vocab_sentencepiece` does (pieces, scores, token types, added tokens as control or
user-defined, no prefix space for Gemma); `write_vocab_gguf` writes only the vocabulary.

`write_gguf` converts such a folder from its `config.json` and `model.safetensors`, following the
converter class of each architecture rather than batchgen's loader: metadata under llama.cpp's
keys (`gguf.Keys`), tensors renamed with `gguf.TensorNameMap`, Q/K rows permuted for the `llama`
and `smollm3` architectures (LlamaModel.permute), Gemma's norms stored as w + 1 and Gemma 2's
lm_head dropped, experts stacked into `ffn_*_exps`, Phi-3's LongRoPE factors as
`rope_factors_long/short` with its attention factor, Gemma 3's local rope base as
`rope.freq_base_swa`. `quantize=True` stores every matrix whose rows split into 32-value blocks
as Q8_0 (as `--outtype q8_0`); `q8_0_round_trip` gives the weights such a file dequantizes to.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import gguf.quants
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tests.tiny_models import finish_gguf

__all__ = [
    "GGUF_ARCHITECTURE",
    "SMALL_VOCAB_SIZE",
    "make_small_vocab_folder",
    "q8_0_round_trip",
    "save_spm_tokenizer",
    "write_gguf",
    "write_vocab_gguf",
]

# Hugging Face model_type -> llama.cpp architecture (the converter class's model_arch).
GGUF_ARCHITECTURE = {
    "llama": "llama",
    "mistral": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "smollm3": "smollm3",
}
_PERMUTED = {"llama", "smollm3"}  # LlamaModel and its subclasses undo HF's rope layout
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
SMALL_VOCAB_SIZE = 384
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. A tiny model reads a tiny vocabulary; "
    "llama.cpp writes GGUF files and batchgen reads them back. 0123456789 !?.,;:'\"()[]{} "
    "Numbers, names and punctuation mix with spaces, tabs\tand new lines\n."
) * 4
_Q8_0_BLOCK = 32



@functools.lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """A byte-level BPE tokenizer of SMALL_VOCAB_SIZE tokens (specials first), as JSON."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SMALL_VOCAB_SIZE,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS], trainer=trainer)
    if tokenizer.get_vocab_size() != SMALL_VOCAB_SIZE:
        raise RuntimeError(
            f"trained {tokenizer.get_vocab_size()} tokens, wanted {SMALL_VOCAB_SIZE}"
        )
    return str(tokenizer.to_str())


def _scale_init(model: torch.nn.Module, *, norm_center: float) -> None:
    """Less flat random weights (as tests.tiny_models does): logits of std about 8, projections
    of gain 2.4 / sqrt(fan_in), norms around `norm_center` (0 for Gemma's 1 + w)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(norm_center + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.1)
            elif "embed_tokens" in name or name.startswith("lm_head"):
                param.normal_(0.0, 8.0 / math.sqrt(param.shape[-1]))
            else:
                param.normal_(0.0, 2.4 / math.sqrt(param.shape[-1]))


def make_small_vocab_folder(
    tmp_path: Path,
    *,
    architecture: str,
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = 16,
    intermediate_size: int = 96,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    extra_config: Mapping[str, Any] | None = None,
    spm_model: bytes | None = None,
) -> Path:
    """A random tiny `architecture` (a Hugging Face model_type) with the small tokenizer, saved by
    transformers into `tmp_path / f"{architecture}-{seed}"`; `extra_config` adds or overrides
    keyword arguments of the transformers config class. With `spm_model` (a serialized
    SentencePiece model) the folder has that vocabulary instead, as Llama 2, Mistral and Gemma
    folders do: `tokenizer.model`, and the `tokenizer.json` transformers converts from it.
    Returns the folder."""
    import transformers

    bos, eos = 0, 2  # <|endoftext|>, <|im_end|>
    vocab_size = SMALL_VOCAB_SIZE
    if spm_model is not None:
        sp = _spm_processor(spm_model)
        bos, eos, vocab_size = sp.bos_id(), sp.eos_id(), sp.get_piece_size()
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": None,
    }
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    kwargs.update(extra_config or {})
    config = transformers.AutoConfig.for_model(architecture, **kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    _scale_init(model, norm_center=0.0 if architecture.startswith("gemma") else 1.0)
    if tie_word_embeddings:
        model.tie_weights()
    folder = Path(tmp_path) / f"{architecture}-{seed}"
    model.save_pretrained(folder)
    if spm_model is not None:
        save_spm_tokenizer(folder, spm_model, gemma=architecture.startswith("gemma"))
        return folder
    (folder / "tokenizer.json").write_text(_tokenizer_json(), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": _SPECIAL_TOKENS[bos], "eos_token": _SPECIAL_TOKENS[eos]}),
        encoding="utf-8",
    )
    return folder


def _spm_processor(spm_model: bytes) -> Any:
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_proto=spm_model)


def save_spm_tokenizer(folder: Path, spm_model: bytes, *, gemma: bool) -> None:
    """Write tokenizer.model into `folder` (created if needed) plus what transformers saves from
    it (tokenizer.json, tokenizer_config.json with added_tokens_decoder), as a Llama 2 / Mistral
    or a Gemma folder holds them; BOS added, EOS not."""
    import transformers

    sp = _spm_processor(spm_model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(spm_model)
    config: dict[str, Any] = {
        "tokenizer_class": "GemmaTokenizer" if gemma else "LlamaTokenizer",
        "add_bos_token": True,
        "add_eos_token": False,
        "legacy": True,  # Llama 2 / Mistral: a prefix space after each special token
    }
    for key, token_id in (
        ("bos_token", sp.bos_id()), ("eos_token", sp.eos_id()),
        ("unk_token", sp.unk_id()), ("pad_token", sp.pad_id()),
    ):  # fmt: skip
        if token_id >= 0:
            config[key] = sp.id_to_piece(token_id)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    transformers.AutoTokenizer.from_pretrained(folder).save_pretrained(folder)
    # transformers 5 saves neither the added tokens nor add_bos_token in tokenizer_config.json;
    # the folders llama.cpp converts (saved by transformers 4) have both.
    saved = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))["added_tokens"]
    saved["added_tokens_decoder"] = {
        str(token["id"]): {key: value for key, value in token.items() if key != "id"}
        for token in added
    }
    saved.update(add_bos_token=True, add_eos_token=False)
    (folder / "tokenizer_config.json").write_text(json.dumps(saved), encoding="utf-8")


def _quantizable(array: np.ndarray) -> bool:
    return array.ndim >= 2 and array.shape[-1] % _Q8_0_BLOCK == 0


def q8_0_round_trip(folder: Path, dest: Path) -> Path:
    """A copy of `folder` whose matrices are what Q8_0 stores of them (quantized, dequantized):
    the weights a `write_gguf(..., quantize=True)` file of it holds, exactly (Q8_0 of such
    values gives them back)."""
    import shutil

    shutil.copytree(folder, dest)
    state = load_file(dest / "model.safetensors")
    for name, tensor in state.items():
        array = tensor.numpy()
        if _quantizable(array):
            packed = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            state[name] = torch.from_numpy(
                gguf.quants.dequantize(packed, gguf.GGMLQuantizationType.Q8_0).reshape(array.shape)
            )
    save_file(state, dest / "model.safetensors", metadata={"format": "pt"})
    return dest


def _rope_parameters(hparams: Mapping[str, Any]) -> dict[str, Any]:
    params = hparams.get("rope_parameters") or {}
    return dict(params.get("full_attention", params))


def _write_metadata(
    writer: gguf.GGUFWriter, arch: str, hparams: Mapping[str, Any], model_type: str
) -> None:
    """The keys each converter class writes (TextModel.set_gguf_parameters and the overrides)."""
    rope = _rope_parameters(hparams)
    head_dim = hparams.get("head_dim") or hparams["hidden_size"] // hparams["num_attention_heads"]
    writer.add_block_count(hparams["num_hidden_layers"])
    writer.add_context_length(hparams["max_position_embeddings"])
    writer.add_embedding_length(hparams["hidden_size"])
    writer.add_feed_forward_length(hparams["intermediate_size"])
    writer.add_head_count(hparams["num_attention_heads"])
    writer.add_head_count_kv(hparams["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(hparams["rms_norm_eps"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch == "phi3":  # Phi3MiniModel writes its own set, no generic rope keys
        rotary = (
            int(rope.get("partial_rotary_factor", 1.0) * hparams["hidden_size"])
            // hparams["num_attention_heads"]
        )
        original = (
            rope.get("original_max_position_embeddings")
            or hparams["original_max_position_embeddings"]
        )
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_dimension_count(rotary)
        writer.add_rope_freq_base(rope["rope_theta"])
        writer.add_sliding_window(hparams.get("sliding_window") or 0)
        return
    writer.add_rope_freq_base(rope["rope_theta"])
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["factor"])
    local = (hparams.get("rope_parameters") or {}).get("sliding_attention")
    if local is not None:
        writer.add_rope_freq_base_swa(local["rope_theta"])
    if "head_dim" in hparams:
        writer.add_key_length(hparams["head_dim"])
        writer.add_value_length(hparams["head_dim"])
    experts = hparams.get("num_local_experts") or hparams.get("num_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(hparams["num_experts_per_tok"])
    if arch in _PERMUTED:  # LlamaModel
        writer.add_vocab_size(hparams["vocab_size"])
        writer.add_rope_dimension_count(head_dim)
    if arch == "qwen3moe":
        writer.add_expert_feed_forward_length(hparams["moe_intermediate_size"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(hparams["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
        writer.add_sliding_window(hparams["sliding_window"])
    if arch == "gemma3":
        if hparams.get("final_logit_softcapping"):
            writer.add_final_logit_softcapping(hparams["final_logit_softcapping"])
        writer.add_sliding_window(hparams["sliding_window"])


def _write_tokenizer(writer: gguf.GGUFWriter, folder: Path, arch: str) -> None:
    """The vocabulary as the converter writes it: SentencePiece when the folder has a
    tokenizer.model (`_set_vocab_sentencepiece`), else the small byte-level BPE."""
    if (folder / "tokenizer.model").is_file():
        _write_spm_vocab(writer, folder, arch)
        return
    model = json.loads(_tokenizer_json())["model"]
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda item: item[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [
            int(gguf.TokenType.CONTROL if token in _SPECIAL_TOKENS else gguf.TokenType.NORMAL)
            for token in tokens
        ]
    )
    writer.add_token_merges(
        [" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]]
    )
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)


def _write_spm_vocab(writer: gguf.GGUFWriter, folder: Path, arch: str) -> None:
    """TextModel._create_vocab_sentencepiece and _set_vocab_sentencepiece: each piece with its
    score and type from the SentencePiece model; tokens tokenizer_config.json lists in
    added_tokens_decoder become control (special, or looking special) or user-defined (with "▁"
    written as " ") with score -1000; special ids and add_bos/add_eos by `gguf.SpecialVocab`;
    Gemma without the prefix space."""
    sp = _spm_processor((folder / "tokenizer.model").read_bytes())
    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    for token_id in range(sp.get_piece_size()):
        kind = gguf.TokenType.NORMAL
        if sp.is_unknown(token_id):
            kind = gguf.TokenType.UNKNOWN
        elif sp.is_control(token_id):
            kind = gguf.TokenType.CONTROL
        elif sp.is_unused(token_id):
            kind = gguf.TokenType.UNUSED
        elif sp.is_byte(token_id):
            kind = gguf.TokenType.BYTE
        tokens.append(sp.id_to_piece(token_id))
        scores.append(sp.get_score(token_id))
        types.append(int(kind))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    for key, data in config.get("added_tokens_decoder", {}).items():
        token_id, token = int(key), data["content"]
        if token_id >= len(tokens):
            continue  # the converter warns and skips it (GemmaTokenizer's <mask>)
        looks_special = token.startswith("<|") and token.endswith("|>")
        if data.get("special") or looks_special:
            types[token_id] = int(gguf.TokenType.CONTROL)
        else:
            token = token.replace("\u2581", " ")
            types[token_id] = int(gguf.TokenType.USER_DEFINED)
        tokens[token_id] = token
        scores[token_id] = -1000.0
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    if arch in ("gemma2", "gemma3"):  # Gemma2Model / Gemma3Model.set_vocab
        writer.add_add_space_prefix(False)


def write_vocab_gguf(folder: Path, path: Path, arch: str) -> Path:
    """A GGUF holding only `folder`'s vocabulary, as `write_gguf` writes it for `arch` (a
    llama.cpp architecture), and no tensors, as llama.cpp's `--vocab-only` does."""
    writer = gguf.GGUFWriter(path, arch)
    _write_tokenizer(writer, folder, arch)
    finish_gguf(writer)
    return path


def _permute(weights: np.ndarray, num_heads: int) -> np.ndarray:
    # LlamaModel.permute: each head's two rotary halves -> interleaved pairs.
    return (
        weights.reshape(num_heads, 2, weights.shape[0] // num_heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _converted_tensors(
    arch: str, hparams: Mapping[str, Any], state: Mapping[str, torch.Tensor]
) -> dict[str, np.ndarray]:
    """HF name -> array after the converter class's modify_tensors (before renaming), experts
    stacked under the merged names the converter maps."""
    out: dict[str, np.ndarray] = {}
    experts: dict[tuple[int, str], dict[int, np.ndarray]] = {}
    for name, tensor in state.items():
        array = tensor.to(torch.float32).numpy()
        if arch == "gemma2" and name == "lm_head.weight":
            continue  # Gemma2Model skips it: llama.cpp always ties Gemma 2
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            array = array + np.float32(1.0)
        if arch in _PERMUTED and ".q_proj." in name:
            array = _permute(array, hparams["num_attention_heads"])
        elif arch in _PERMUTED and ".k_proj." in name:
            array = _permute(array, hparams["num_key_value_heads"])
        if ".experts." in name:
            # model.layers.N.mlp.experts.E.gate_proj.weight / ...block_sparse_moe.experts.E.w1.weight
            parts = name.split(".")
            layer_idx, expert_idx, proj = (
                int(parts[2]),
                int(parts[parts.index("experts") + 1]),
                parts[-2],
            )
            experts.setdefault((layer_idx, proj), {})[expert_idx] = array
            continue
        out[name] = array
    for (layer_idx, proj), by_expert in experts.items():
        stacked = np.stack([by_expert[e] for e in sorted(by_expert)])
        if arch == "llama":  # LlamaModel merges Mixtral's experts under the original llama names
            out[f"layers.{layer_idx}.feed_forward.experts.{proj}.weight"] = stacked
        else:  # Qwen2MoeModel
            out[f"model.layers.{layer_idx}.mlp.experts.{proj}.weight"] = stacked
    return out


def write_gguf(folder: Path, path: Path, *, quantize: bool = False) -> Path:
    """Convert the Hugging Face `folder` into the GGUF file `path` (module docstring)."""
    hparams = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    model_type = hparams["model_type"]
    arch = GGUF_ARCHITECTURE[model_type]
    model_arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    name_map = gguf.get_tensor_name_map(model_arch, hparams["num_hidden_layers"])
    writer = gguf.GGUFWriter(path, arch)
    _write_metadata(writer, arch, hparams, model_type)
    _write_tokenizer(writer, folder, arch)
    if arch == "phi3":  # Phi3MiniModel.generate_extra_tensors
        rope = _rope_parameters(hparams)
        if rope.get("rope_type") == "longrope":
            original = (
                rope.get("original_max_position_embeddings")
                or hparams["original_max_position_embeddings"]
            )
            scale = hparams["max_position_embeddings"] / original
            writer.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
            )
            writer.add_tensor(
                "rope_factors_long.weight", np.asarray(rope["long_factor"], dtype=np.float32)
            )
            writer.add_tensor(
                "rope_factors_short.weight", np.asarray(rope["short_factor"], dtype=np.float32)
            )
    state = load_file(folder / "model.safetensors")
    for hf_name, array in _converted_tensors(arch, hparams, state).items():
        gguf_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"the converter has no GGUF name for {hf_name!r} ({arch})")
        array = np.ascontiguousarray(array)
        if quantize and _quantizable(array):
            packed = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, packed, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name, array)
    finish_gguf(writer)
    return path
