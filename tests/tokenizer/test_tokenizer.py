"""Tokenizer: ids equal transformers' for the SmolLM2 GGUF and for Hugging Face folders."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import gguf
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchgen.models.checkpoint import default_model_path
from batchgen.tokenizer.tokenizer import Tokenizer
from tests.tiny_models import make_tiny_hf_folder, smollm2_tokenizer

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nruns",
    "\r\nwindows line end\r\n",
    "12345",
    "x = 3.14159 * 2 ** 10 - 1_000_000",
    "phone: +1 (555) 010-9999",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    '<html><body class="x">&amp;</body></html>',
    "héllo wörld café naïve",
    "日本語のテキストです。",
    "Привет, мир!",
    "مرحبا بالعالم",
    "emoji 🤖🚀 and family 👨‍👩‍👧‍👦",
    "mixed🙂text",
    "don't won't I'll we've they're",
    "ALL CAPS SHOUTING AND lowercase",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text with <|im_end|> in the middle",
    "<|endoftext|>",
    "<|im_start|><|im_start|>double",
    "<|im_start but not special",
    "a" * 50,
    " ",
    "",
]


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    return smollm2_tokenizer()


@pytest.fixture(scope="module")
def reference() -> Any:
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def test_gguf_backend_equals_transformers_conversion(ours: Tokenizer, reference: Any) -> None:
    assert json.loads(ours.backend.to_str()) == json.loads(reference.backend_tokenizer.to_str())


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_ids_match_transformers(ours: Tokenizer, reference: Any, text: str) -> None:
    expected = reference(text)["input_ids"]
    assert ours.encode(text) == expected
    assert (
        ours.encode(text, add_special_tokens=False)
        == reference(text, add_special_tokens=False)["input_ids"]
    )
    assert ours.decode(expected, skip_special_tokens=False) == reference.decode(
        expected, skip_special_tokens=False
    )
    assert ours.decode(expected) == reference.decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_round_trips(ours: Tokenizer, text: str) -> None:
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


def test_decode_skips_special_tokens(ours: Tokenizer) -> None:
    ids = ours.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert ours.decode(ids) == "user\nhi"
    assert ours.decode(ids, skip_special_tokens=False) == "<|im_start|>user\nhi<|im_end|>"


def test_encode_batch_equals_encode(ours: Tokenizer) -> None:
    assert ours.encode_batch(TEXTS) == [ours.encode(text) for text in TEXTS]
    assert ours.decode_batch(ours.encode_batch(TEXTS), skip_special_tokens=False) == TEXTS


def test_gguf_special_tokens(ours: Tokenizer) -> None:
    assert ours.vocab_size == 49152
    assert (ours.bos_token, ours.bos_token_id) == ("<|im_start|>", 1)
    assert (ours.eos_token, ours.eos_token_id) == ("<|im_end|>", 2)
    assert ours.token_to_id("<|endoftext|>") == 0
    assert ours.token_to_id("no such token at all") is None
    # tokenizer.ggml.add_bos_token is false: no BOS even with add_special_tokens
    assert ours.encode("hi") == ours.encode("hi", add_special_tokens=False)
    assert ours.chat_template is not None and "<|im_start|>" in ours.chat_template


def test_fingerprint_is_stable_and_content_sensitive(ours: Tokenizer, tmp_path: Path) -> None:
    rebuilt = Tokenizer.from_gguf(gguf.GGUFReader(default_model_path()))
    assert rebuilt.fingerprint == ours.fingerprint
    assert len(ours.fingerprint) == 64
    ours.save_pretrained(tmp_path)
    assert Tokenizer.from_hf_folder(tmp_path).fingerprint == ours.fingerprint
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert Tokenizer.from_hf_folder(tmp_path).fingerprint != ours.fingerprint


def test_hf_folder_matches_transformers(ours: Tokenizer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = make_tiny_hf_folder(tmp_path)
    loaded = Tokenizer.from_hf_folder(folder)
    reference = AutoTokenizer.from_pretrained(folder)
    assert loaded.vocab_size == ours.vocab_size
    assert (loaded.bos_token_id, loaded.eos_token_id) == (1, 2)
    assert loaded.chat_template == ours.chat_template
    for text in TEXTS:
        assert loaded.encode(text) == ours.encode(text) == reference(text)["input_ids"]


def _with_tokenizer_config(folder: Path, **changes: Any) -> None:
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(changes)
    config_file.write_text(json.dumps(config))


def _folder_adding_bos(ours: Tokenizer, folder: Path) -> None:
    from tokenizers import Tokenizer as Backend
    from tokenizers import processors

    ours.save_pretrained(folder)
    backend = Backend.from_str(ours.backend.to_str())
    backend.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", pair="<|im_start|> $A $B", special_tokens=[("<|im_start|>", 1)]
    )
    backend.save(str(folder / "tokenizer.json"))


def test_post_processor_adds_bos(ours: Tokenizer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    _folder_adding_bos(ours, tmp_path)
    loaded = Tokenizer.from_hf_folder(tmp_path)
    reference = AutoTokenizer.from_pretrained(tmp_path)
    for text in ("Hello world", ""):
        assert loaded.encode(text) == reference(text)["input_ids"] == [1, *ours.encode(text)]
        assert loaded.encode(text, add_special_tokens=False) == ours.encode(text)
    assert loaded.encode_batch(["a", "b"]) == [[1, *ours.encode("a")], [1, *ours.encode("b")]]
    assert loaded.encode_batch(["a"], add_special_tokens=False) == [ours.encode("a")]
    # The chat prompt carries its own special tokens: no extra BOS.
    messages = [{"role": "user", "content": "hi"}]
    assert loaded.encode_chat(messages) == ours.encode_chat(messages)


def test_add_bos_token_in_config_defers_to_tokenizer_json(ours: Tokenizer, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ours.save_pretrained(tmp_path)
    _with_tokenizer_config(tmp_path, add_bos_token=True)
    loaded = Tokenizer.from_hf_folder(tmp_path)
    assert loaded.encode("hi") == AutoTokenizer.from_pretrained(tmp_path)("hi")["input_ids"]
    assert loaded.encode("hi") == ours.encode("hi")


def test_chat_template_file_precedence(ours: Tokenizer, tmp_path: Path) -> None:
    ours.save_pretrained(tmp_path)
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "from json"}))
    assert Tokenizer.from_hf_folder(tmp_path).chat_template == "from json"
    (tmp_path / "chat_template.jinja").write_text("from jinja")
    assert Tokenizer.from_hf_folder(tmp_path).chat_template == "from jinja"


def test_named_chat_templates_pick_default(ours: Tokenizer, tmp_path: Path) -> None:
    ours.save_pretrained(tmp_path)
    _with_tokenizer_config(
        tmp_path,
        chat_template=[
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "plain"},
        ],
    )
    assert Tokenizer.from_hf_folder(tmp_path).chat_template == "plain"


def test_added_token_dicts_in_tokenizer_config(ours: Tokenizer, tmp_path: Path) -> None:
    ours.save_pretrained(tmp_path)
    _with_tokenizer_config(tmp_path, eos_token={"content": "<|endoftext|>", "__type": "AddedToken"})
    loaded = Tokenizer.from_hf_folder(tmp_path)
    assert (loaded.eos_token, loaded.eos_token_id) == ("<|endoftext|>", 0)


def test_missing_tokenizer_json_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "tokenizer.json")):
        Tokenizer.from_hf_folder(tmp_path)


def test_malformed_tokenizer_config_names_the_file(ours: Tokenizer, tmp_path: Path) -> None:
    ours.save_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        Tokenizer.from_hf_folder(tmp_path)


def test_encode_chat_equals_transformers(ours: Tokenizer, reference: Any) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    prompt = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(messages) == prompt
    assert ours.encode_chat(messages) == reference(prompt, add_special_tokens=False)["input_ids"]
