"""A GGUF file's `tokenizer.ggml.*` metadata as a Hugging Face `tokenizers` backend.

Two vocabularies, by `tokenizer.ggml.model`:

- `gpt2`, byte-level BPE (Llama 3, Qwen, SmolLM, Phi-4-mini): built as `transformers` builds it
  for the same file (`AutoTokenizer.from_pretrained(..., gguf_file=...)`), with the file's
  vocabulary and merges and the GPT-2 split unless `tokenizer.ggml.pre` names a known different
  one, so ids match `transformers` token for token;
- `llama`, SentencePiece BPE (Llama 2, Mistral 7B, Mixtral, Phi-3-mini, Gemma 2 and 3): merges
  ranked by `tokenizer.ggml.scores`, byte fallback, "▁" for spaces and a prefix space as
  `add_space_prefix` says (absent: yes), encoding as SentencePiece and llama.cpp do (`gguf_spm`).

In both, control tokens (and SentencePiece's unknown token) are special added tokens and
user-defined ones plain added tokens, both matched whole in the text, and a post-processor adds
BOS/EOS as `add_bos_token`/`add_eos_token` say (absent: BOS for `llama`, as llama.cpp does).

Imports `tokenizers` and `gguf_spm`; no torch, nothing else of batchgen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

from batchgen.tokenizer.gguf_spm import TOKEN_TYPE_NORMAL, spm_backend

__all__ = ["GGUFSource", "GgufTokenizer", "gguf_tokenizer"]


class GGUFSource(Protocol):
    """What the config and tokenizer readers use of a GGUF file: `gguf.GGUFReader`, or
    `batchgen.models.gguf_header.GGUFHeader` (the metadata alone, read fast). `fields[key]` has
    `contents()`; each of `tensors` has a `name`."""

    @property
    def fields(self) -> Mapping[str, Any]: ...

    @property
    def tensors(self) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class GgufTokenizer:
    """The backend and the named pieces `Tokenizer` needs."""

    backend: _Backend
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None


# GGUF token types (llama.cpp's llama_token_type).
_TOKEN_TYPE_UNKNOWN = 2
_TOKEN_TYPE_CONTROL = 3
_TOKEN_TYPE_USER_DEFINED = 4

# Pre-tokenizer splits by `tokenizer.ggml.pre`, as transformers maps them; a value not listed
# (e.g. "smollm", "default", "gpt-2") keeps the GPT-2 split of the ByteLevel pre-tokenizer.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GGUF_PRE_SPLITS: dict[str, str] = {
    **dict.fromkeys(
        (
            "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
            "lfm2", "jina-v5-nano", "dbrx", "smaug-bpe",
        ),
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}  # fmt: skip


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _gguf_field(reader: GGUFSource, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _post_processor(
    bos_token: str | None,
    bos_token_id: int | None,
    eos_token: str | None,
    eos_token_id: int | None,
    *,
    add_bos_token: bool,
    add_eos_token: bool,
) -> processors.TemplateProcessing:
    """The BOS/EOS template transformers installs for explicit `add_bos_token`/`add_eos_token`."""
    add_bos = add_bos_token and bos_token is not None and bos_token_id is not None
    add_eos = add_eos_token and eos_token is not None and eos_token_id is not None
    single = f"{f'{bos_token}:0 ' if add_bos else ''}$A:0{f' {eos_token}:0' if add_eos else ''}"
    pair = (
        f"{single}{f' {bos_token}:1' if add_bos else ''} $B:1{f' {eos_token}:1' if add_eos else ''}"
    )
    special_tokens: list[tuple[str, int]] = []
    if add_bos:
        assert bos_token is not None and bos_token_id is not None
        special_tokens.append((bos_token, bos_token_id))
    if add_eos:
        assert eos_token is not None and eos_token_id is not None
        special_tokens.append((eos_token, eos_token_id))
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special_tokens)


def _byte_level_backend(reader: GGUFSource, tokens: list[str], where: str) -> _Backend:
    """Byte-level BPE from the file's merges, split as `tokenizer.ggml.pre` says."""
    merges = _gguf_field(reader, "tokenizer.ggml.merges")
    if not merges:
        raise ValueError(f"{where}: tokenizer.ggml.merges is missing or empty")
    byte_chars = _bytes_to_unicode()
    alphabet = set(byte_chars.values())
    vocab = {
        token if set(token) <= alphabet else "".join(byte_chars[b] for b in token.encode()): idx
        for idx, token in enumerate(tokens)
    }
    merge_pairs: list[tuple[str, str]] = []
    for merge in merges:
        left, sep, right = merge.partition(" ")
        if not sep or " " in right:
            raise ValueError(f"{where}: tokenizer.ggml.merges entry {merge!r} is not 'a b'")
        merge_pairs.append((left, right))
    backend = _Backend(
        BPE(
            vocab=vocab,
            merges=merge_pairs,
            dropout=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    split = _GGUF_PRE_SPLITS.get(str(_gguf_field(reader, "tokenizer.ggml.pre")))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_backend(
    reader: GGUFSource, tokens: list[str], token_types: list[int], where: str
) -> _Backend:
    """SentencePiece BPE from the file's scores (`gguf_spm`); the unknown piece is the one
    `unknown_token_id` names, else the one typed unknown."""
    scores = _gguf_field(reader, "tokenizer.ggml.scores")
    if not scores or len(scores) != len(tokens):
        raise ValueError(
            f"{where}: tokenizer.ggml.scores has {len(scores or [])} entries for {len(tokens)} tokens"
        )
    if token_types and len(token_types) != len(tokens):
        raise ValueError(
            f"{where}: tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens"
        )
    types = token_types or [TOKEN_TYPE_NORMAL] * len(tokens)
    unk_id = _gguf_field(reader, "tokenizer.ggml.unknown_token_id")
    if unk_id is None:
        unk_id = next((i for i, kind in enumerate(types) if kind == _TOKEN_TYPE_UNKNOWN), None)
    if unk_id is not None and not 0 <= unk_id < len(tokens):
        raise ValueError(f"{where}: tokenizer.ggml.unknown_token_id {unk_id} is out of range")
    # llama.cpp's defaults for a SentencePiece vocabulary: a prefix space unless the file says no.
    add_space_prefix = _gguf_field(reader, "tokenizer.ggml.add_space_prefix")
    return spm_backend(
        tokens,
        [float(score) for score in scores],
        types,
        unk_token=None if unk_id is None else tokens[unk_id],
        add_space_prefix=True if add_space_prefix is None else bool(add_space_prefix),
    )


def gguf_tokenizer(reader: GGUFSource) -> GgufTokenizer:
    """Build the backend from `reader`'s metadata. Raises ValueError naming the key for an
    unsupported tokenizer model, missing tokens/merges/scores or an out-of-range special token
    id."""
    source = getattr(reader, "data", None)  # a GGUFReader's memory map
    where = f"{getattr(source, 'filename', None) or getattr(reader, 'path', None) or 'GGUF file'}"
    model = _gguf_field(reader, "tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ValueError(
            f"{where}: tokenizer.ggml.model {model!r} is not supported; supported: 'gpt2' "
            "(byte-level BPE), 'llama' (SentencePiece BPE)"
        )
    tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise ValueError(f"{where}: tokenizer.ggml.tokens is missing or empty")
    token_types: list[int] = _gguf_field(reader, "tokenizer.ggml.token_type") or []
    if model == "gpt2":
        backend = _byte_level_backend(reader, tokens, where)
        # A control token written outside the byte alphabet is a llama.cpp mislabel and is
        # skipped, as transformers does.
        alphabet: set[str] | None = set(_bytes_to_unicode().values())
        special_types = {_TOKEN_TYPE_CONTROL}
    else:
        backend = _spm_backend(reader, tokens, token_types, where)
        alphabet = None
        special_types = {_TOKEN_TYPE_CONTROL, _TOKEN_TYPE_UNKNOWN}
    vocab = backend.get_vocab()

    def named(key: str) -> str | None:
        token_id = _gguf_field(reader, f"tokenizer.ggml.{key}")
        if token_id is None:
            return None
        if not 0 <= token_id < len(tokens):
            raise ValueError(f"{where}: tokenizer.ggml.{key} {token_id} is out of range")
        return str(tokens[token_id])

    bos_token, eos_token = named("bos_token_id"), named("eos_token_id")
    # Control (and, for SentencePiece, unknown) tokens are matched whole and are special.
    specials = [
        token
        for token, kind in zip(tokens, token_types, strict=False)
        if kind in special_types and (alphabet is None or set(token) <= alphabet)
    ]
    named_specials = [
        token
        for token in (
            bos_token,
            eos_token,
            named("unknown_token_id"),
            named("padding_token_id"),
        )
        if token is not None and token in vocab and token not in specials
    ]
    backend.add_special_tokens(
        [AddedToken(token, normalized=False, special=True) for token in specials + named_specials]
    )
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _TOKEN_TYPE_USER_DEFINED and token in vocab
    ]
    if user_defined:
        backend.add_tokens(user_defined)
    # llama.cpp (and transformers) add BOS to a SentencePiece vocabulary that does not say.
    add_bos = _gguf_field(reader, "tokenizer.ggml.add_bos_token")
    backend.post_processor = _post_processor(
        bos_token,
        None if bos_token is None else backend.token_to_id(bos_token),
        eos_token,
        None if eos_token is None else backend.token_to_id(eos_token),
        add_bos_token=bool(model == "llama" if add_bos is None else add_bos),
        add_eos_token=bool(_gguf_field(reader, "tokenizer.ggml.add_eos_token") or False),
    )
    template = _gguf_field(reader, "tokenizer.chat_template")
    return GgufTokenizer(
        backend=backend,
        bos_token=bos_token,
        eos_token=eos_token,
        chat_template=None if template is None else str(template),
    )
