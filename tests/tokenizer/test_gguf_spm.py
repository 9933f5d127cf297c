"""GGUF files with a SentencePiece vocabulary (`tokenizer.ggml.model` "llama": Llama 2, Mistral 7B,
Mixtral, Phi-3-mini, Gemma) encode and decode as their SentencePiece model does (issue 23).

Two small SentencePiece BPE models are trained here, with the `sentencepiece` library, on lines of
the packaged ShareGPT text, set up as Llama 2's and Gemma's are: identity normalization, spaces
kept as they are, digits split, byte fallback, whitespace-only pieces, two control tokens and two
user-defined ones; Llama's with the dummy prefix and ids unk/bos/eos 0/1/2, Gemma's without it
and pad/eos/bos/unk 0/1/2/3. Each goes into a Hugging Face folder (transformers converts it to
tokenizer.json) and from there into a GGUF as llama.cpp's converter writes it
(`tests/gguf_writer.py`: pieces, scores, token types with byte and control tokens, added tokens,
no prefix space for Gemma), which batchgen reads back with `Tokenizer.from_gguf`.

The reference is `sentencepiece` itself, on a few hundred ShareGPT turns as they are, with
leading spaces, with blank lines, and with characters outside the vocabulary (byte fallback):
the same ids with and without BOS, and the same text decoded. Text holding special tokens
follows llama.cpp: it is cut at control, unknown and user-defined tokens and each stretch is
encoded by SentencePiece on its own (so with its own prefix space). A tiny Mistral with the
Llama-style vocabulary gives the same prompt ids and greedy tokens from its GGUF as from its
folder through `batchgen.LLM`.
"""

from __future__ import annotations

import io
import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import pytest
import sentencepiece

from batchgen import LLM, SamplingParams
from batchgen.data.sharegpt import iter_sharegpt_conversations
from batchgen.tokenizer import Tokenizer
from tests.gguf_writer import (
    make_small_vocab_folder,
    save_spm_tokenizer,
    write_gguf,
    write_vocab_gguf,
)
from tests.tiny_models import finish_gguf

VOCAB_SIZE = 1000
CONTROL = ["<|im_start|>", "<|im_end|>"]
USER_DEFINED = ["<start_of_turn>", "<end_of_turn>"]
NUM_TRAIN_CONVERSATIONS = 150
NUM_TEXTS = 250
OUTSIDE_VOCAB = " ∮ 漢字 🙂"  # rare characters: byte fallback

# Per style: trainer options beyond the shared ones, and the llama.cpp architecture.
STYLES: dict[str, dict[str, Any]] = {
    "llama": {
        "arch": "llama",
        "spec": {"add_dummy_prefix": True, "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1},
    },
    "gemma": {
        "arch": "gemma2",
        "spec": {
            "add_dummy_prefix": False, "pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3,
            "pad_piece": "<pad>", "eos_piece": "<eos>", "bos_piece": "<bos>",
        },
    },
}  # fmt: skip


def _conversation_texts() -> list[str]:
    """Every turn of the first conversations, in file order."""
    count = NUM_TRAIN_CONVERSATIONS + NUM_TEXTS
    return [
        message["content"]
        for _, messages in itertools.islice(iter_sharegpt_conversations(), count)
        for message in messages
    ]


@pytest.fixture(scope="module")
def turns() -> tuple[list[str], list[str]]:
    """(training lines, held-out turns): the first conversations train, later turns test."""
    texts = _conversation_texts()
    train = [line for text in texts[:NUM_TRAIN_CONVERSATIONS] for line in text.split("\n") if line]
    return train, texts[-NUM_TEXTS:]


def _train(lines: list[str], spec: dict[str, Any]) -> bytes:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        control_symbols=CONTROL,
        user_defined_symbols=USER_DEFINED,
        max_sentence_length=1 << 16,
        num_threads=1,
        minloglevel=2,
        **spec,
    )
    return model.getvalue()


@pytest.fixture(scope="module")
def models(turns: tuple[list[str], list[str]]) -> dict[str, bytes]:
    """Each style's serialized SentencePiece model."""
    return {style: _train(turns[0], STYLES[style]["spec"]) for style in sorted(STYLES)}


@dataclass(frozen=True)
class Vocab:
    style: str
    sp: Any  # sentencepiece.SentencePieceProcessor
    ours: Tokenizer
    path: Path


@pytest.fixture(scope="module", params=sorted(STYLES))
def vocab(
    request: pytest.FixtureRequest,
    models: dict[str, bytes],
    tmp_path_factory: pytest.TempPathFactory,
) -> Vocab:
    model = models[request.param]
    folder = tmp_path_factory.mktemp(f"{request.param}-vocab")
    save_spm_tokenizer(folder, model, gemma=request.param == "gemma")
    path = write_vocab_gguf(folder, folder / "vocab.gguf", STYLES[request.param]["arch"])
    return Vocab(
        style=request.param,
        sp=sentencepiece.SentencePieceProcessor(model_proto=model),
        ours=Tokenizer.from_gguf(gguf.GGUFReader(path)),
        path=path,
    )


def _variants(text: str) -> list[str]:
    return [
        text,
        "  " + text,  # leading spaces
        "\n" + text.replace(". ", ".\n\n") + "\n",  # blank lines, a newline first and last
        text[:300] + OUTSIDE_VOCAB + "\tend ",
    ]


def test_file_is_a_sentencepiece_gguf(vocab: Vocab) -> None:
    """The file is what the converter writes; batchgen's BOS/EOS are the model's."""
    reader = gguf.GGUFReader(vocab.path)
    assert reader.fields["tokenizer.ggml.model"].contents() == "llama"
    assert "tokenizer.ggml.merges" not in reader.fields
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = dict(zip(tokens, reader.fields["tokenizer.ggml.token_type"].contents(), strict=True))
    assert list(types.values()).count(gguf.TokenType.BYTE) == 256
    assert types["<0x0A>"] == gguf.TokenType.BYTE
    # Added tokens the folder marks special are control, the others user-defined.
    special = [vocab.sp.id_to_piece(i) for i in (vocab.sp.bos_id(), vocab.sp.eos_id())]
    for token in [*special, "<unk>", *CONTROL]:
        assert types[token] == gguf.TokenType.CONTROL, token
    for token in USER_DEFINED:
        assert types[token] == gguf.TokenType.USER_DEFINED, token
    has_prefix_key = "tokenizer.ggml.add_space_prefix" in reader.fields
    assert has_prefix_key == (vocab.style == "gemma")  # llama: absent, which means true
    assert vocab.ours.vocab_size == VOCAB_SIZE
    assert vocab.ours.bos_token_id == vocab.sp.bos_id()
    assert vocab.ours.eos_token_id == vocab.sp.eos_id()


def test_encode_and_decode_match_sentencepiece(
    vocab: Vocab, turns: tuple[list[str], list[str]]
) -> None:
    texts = ["", " ", "\n", *(v for text in turns[1] for v in _variants(text))]
    expected = vocab.sp.encode(texts)
    assert vocab.ours.encode_batch(texts, add_special_tokens=False) == expected
    bos = vocab.sp.bos_id()
    assert vocab.ours.encode_batch(texts) == [[bos, *ids] for ids in expected]
    assert vocab.ours.decode_batch(expected) == vocab.sp.decode(expected)
    # The texts reach every path: byte fallback, merged pieces, whitespace-only pieces.
    pieces = {vocab.sp.id_to_piece(t) for ids in expected for t in ids}
    assert any(vocab.sp.is_byte(t) for ids in expected for t in ids)
    assert any(len(p) >= 4 and not p.startswith("<0x") for p in pieces)
    assert any(set(p) == {"▁"} and len(p) > 1 for p in pieces)


def _llama_cpp_reference(sp: Any, text: str) -> list[int]:
    """llama.cpp with special tokens parsed: cut at control, unknown and user-defined tokens,
    and SentencePiece each stretch between them on its own."""
    specials = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    specials = [
        piece
        for i, piece in enumerate(specials)
        if sp.is_control(i) or sp.is_unknown(i) or piece in USER_DEFINED
    ]
    pattern = "|".join(re.escape(piece) for piece in sorted(specials, key=len, reverse=True))
    ids: list[int] = []
    for index, part in enumerate(re.split(f"({pattern})", text)):
        if index % 2:
            ids.append(sp.piece_to_id(part))
        elif part:
            ids.extend(sp.encode(part))
    return ids


def test_special_tokens_in_text_are_matched_whole(
    vocab: Vocab, turns: tuple[list[str], list[str]]
) -> None:
    sp = vocab.sp
    bos, eos = sp.id_to_piece(sp.bos_id()), sp.id_to_piece(sp.eos_id())
    texts = []
    for question, answer in itertools.pairwise(turns[1][:80]):
        question, answer = question[:400], answer[:400]
        texts.append(
            f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n {answer}<|im_end|>"
        )
        texts.append(f"{bos}<start_of_turn>user {question}<end_of_turn>{answer}{eos}<unk>x")
    expected = [_llama_cpp_reference(sp, text) for text in texts]
    assert vocab.ours.encode_batch(texts, add_special_tokens=False) == expected
    assert [ids.count(sp.piece_to_id("<start_of_turn>")) for ids in expected[1::2]] == [1] * 79
    # Decoding drops control tokens, as SentencePiece does (which writes <unk> as " ⁇ ").
    known = [[t for t in ids if t != sp.unk_id()] for ids in expected]
    assert vocab.ours.decode_batch(known) == sp.decode(known)


def test_unsupported_tokenizer_model_is_named(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "t5.gguf", "t5")
    writer.add_tokenizer_model("t5")
    writer.add_token_list(["<pad>", "</s>", "▁a"])
    finish_gguf(writer)
    with pytest.raises(
        ValueError,
        match=r"t5\.gguf: tokenizer\.ggml\.model 't5' is not supported; supported: 'gpt2' "
        r"\(byte-level BPE\), 'llama' \(SentencePiece BPE\)$",
    ):
        Tokenizer.from_gguf(gguf.GGUFReader(tmp_path / "t5.gguf"))


def test_missing_scores_are_named(tmp_path: Path) -> None:
    writer = gguf.GGUFWriter(tmp_path / "noscores.gguf", "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "▁a"])
    finish_gguf(writer)
    with pytest.raises(
        ValueError, match=r"noscores\.gguf: tokenizer\.ggml\.scores has 0 entries for 4 tokens$"
    ):
        Tokenizer.from_gguf(gguf.GGUFReader(tmp_path / "noscores.gguf"))


def test_mistral_gguf_with_sentencepiece_vocab_generates_as_its_folder(
    tmp_path: Path, turns: tuple[list[str], list[str]], models: dict[str, bytes]
) -> None:
    """llama.cpp stores Mistral as `llama` with the SentencePiece vocabulary and no
    add_space_prefix key; text prompts give the folder's ids and greedy tokens."""
    model = models["llama"]
    folder = make_small_vocab_folder(
        tmp_path, architecture="mistral", extra_config={"sliding_window": None}, spm_model=model
    )
    path = write_gguf(folder, tmp_path / "mistral-spm.gguf")
    prompts = [
        turns[1][0][:200],
        "<|im_start|>user\nWrite a haiku about GGUF files.<|im_end|>\n<|im_start|>assistant\n",
        "Numbers 1234 and naïve café ∮ unicode",
    ]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    engine = {"num_kv_blocks": 64, "max_model_len": 256, "max_num_batched_tokens": 128}
    ours = LLM(str(path), seed=0, **engine).generate(prompts, params, use_tqdm=False)
    reference = LLM(str(folder), seed=0, **engine).generate(prompts, params, use_tqdm=False)
    sp = sentencepiece.SentencePieceProcessor(model_proto=model)
    assert ours[0].prompt_token_ids == (sp.bos_id(), *sp.encode(prompts[0]))
    for out, ref in zip(ours, reference, strict=True):
        assert out.prompt_token_ids == ref.prompt_token_ids
        assert out.outputs[0].token_ids == ref.outputs[0].token_ids
        assert out.outputs[0].text == ref.outputs[0].text
    assert len({tuple(out.outputs[0].token_ids) for out in reference}) > 1
