"""Text <-> token ids for a model, and its chat template, over a Hugging Face `tokenizers` backend.

`Tokenizer` is built from a Hugging Face folder (`tokenizer.json` + `tokenizer_config.json`) or
from a GGUF file's `tokenizer.ggml.*` metadata. The GGUF build reproduces what `transformers`
builds for the same file (`AutoTokenizer.from_pretrained(..., gguf_file=...)`): byte-level BPE
with the file's vocabulary and merges, the GPT-2 split unless `tokenizer.ggml.pre` names a known
different one, control tokens as special added tokens, and a post-processor that adds BOS/EOS as
`add_bos_token`/`add_eos_token` say. Ids therefore match `transformers` token for token.

Invariants: the backend never truncates or pads; the object is immutable after construction, so
it may be shared by worker threads. `fingerprint` hashes everything that changes ids or prompts.

Imports `tokenizers` and `batchgen.chat_template`; no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers, processors
from tokenizers import Tokenizer as _Backend
from tokenizers.models import BPE

from batchgen.chat_template import ChatTemplateError, render_chat_template

if TYPE_CHECKING:
    import gguf

__all__ = ["Tokenizer"]

# GGUF token types (llama.cpp's llama_token_type).
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


def _gguf_field(reader: gguf.GGUFReader, key: str) -> Any:
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


def _token_content(value: object, *, source: Path, key: str) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise ValueError(f"{source}: {key} must be a string or an AddedToken mapping, got {value!r}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _folder_chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """chat_template.jinja, then chat_template.json, then tokenizer_config.json (transformers' order)."""
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    json_file = folder / "chat_template.json"
    template: object = None
    source = folder / "tokenizer_config.json"
    if json_file.is_file():
        template = _read_json(json_file).get("chat_template")
        source = json_file
    else:
        template = config.get("chat_template")
    if template is None or isinstance(template, str):
        return template
    if isinstance(template, list):
        # Named templates: [{"name": "default", "template": "..."}, ...]
        named = {
            item.get("name"): item.get("template") for item in template if isinstance(item, Mapping)
        }
        default = named.get("default")
        if isinstance(default, str):
            return default
        raise ValueError(f"{source}: chat_template list has no 'default' entry")
    raise ValueError(f"{source}: chat_template must be a string, got {type(template).__name__}")


class Tokenizer:
    """A model's tokenizer and chat template.

    Use `from_hf_folder` or `from_gguf`. `vocab_size` counts added tokens. Encoding never
    truncates; `add_special_tokens=True` adds BOS/EOS only where the model's tokenizer does.
    """

    __slots__ = (
        "_backend",
        "bos_token",
        "bos_token_id",
        "chat_template",
        "eos_token",
        "eos_token_id",
        "fingerprint",
        "vocab_size",
    )

    def __init__(
        self,
        backend: _Backend,
        *,
        bos_token: str | None,
        eos_token: str | None,
        chat_template: str | None,
    ) -> None:
        """Wrap `backend` (taken over: it is not to be changed afterwards); truncation and
        padding are switched off on it."""
        backend.no_truncation()
        backend.no_padding()
        self._backend = backend
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id: int | None = (
            None if bos_token is None else backend.token_to_id(bos_token)
        )
        self.eos_token_id: int | None = (
            None if eos_token is None else backend.token_to_id(eos_token)
        )
        self.chat_template = chat_template
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        digest = hashlib.sha256()
        digest.update(backend.to_str().encode("utf-8"))
        for part in (chat_template, bos_token, eos_token):
            digest.update(b"\0" + (b"\1" if part is None else part.encode("utf-8")))
        self.fingerprint: str = digest.hexdigest()

    # ---------------------------------------------------------------- construction

    @classmethod
    def from_hf_folder(cls, folder: Path) -> Tokenizer:
        """Load `folder/tokenizer.json` plus, when present, `tokenizer_config.json`,
        `special_tokens_map.json`, `chat_template.jinja` / `chat_template.json`.

        BOS/EOS are added by add_special_tokens exactly when tokenizer.json's post-processor adds
        them (as transformers does for a folder that has a tokenizer.json).

        Raises FileNotFoundError naming the missing tokenizer.json, ValueError for malformed files.
        """
        folder = Path(folder)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(
                f"{tokenizer_file}: not found; expected a Hugging Face fast tokenizer "
                "(tokenizer.json) in the model folder"
            )
        try:
            backend = _Backend.from_file(str(tokenizer_file))
        except Exception as exc:  # tokenizers raises plain Exception on parse errors
            raise ValueError(f"{tokenizer_file}: cannot be read as a tokenizer: {exc}") from exc
        config_file = folder / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        special_file = folder / "special_tokens_map.json"
        special = _read_json(special_file) if special_file.is_file() else {}

        def token(key: str) -> str | None:
            if config.get(key) is not None:
                return _token_content(config[key], source=config_file, key=key)
            return _token_content(special.get(key), source=special_file, key=key)

        bos_token, eos_token = token("bos_token"), token("eos_token")
        # As in transformers 5: with a tokenizer.json, its post-processor alone decides whether
        # BOS/EOS are added; add_bos_token/add_eos_token in tokenizer_config.json are ignored.
        return cls(
            backend,
            bos_token=bos_token,
            eos_token=eos_token,
            chat_template=_folder_chat_template(folder, config),
        )

    @classmethod
    def from_gguf(cls, reader: gguf.GGUFReader) -> Tokenizer:
        """Build from `tokenizer.ggml.*` metadata exactly as transformers converts it.

        Only byte-level BPE (`tokenizer.ggml.model == "gpt2"`) is supported; anything else, or
        missing tokens/merges, raises ValueError naming the key.
        """
        source = getattr(reader, "data", None)
        where = f"{getattr(source, 'filename', 'GGUF file')}"
        model = _gguf_field(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(
                f"{where}: tokenizer.ggml.model {model!r} is not supported; supported: 'gpt2' "
                "(byte-level BPE)"
            )
        tokens = _gguf_field(reader, "tokenizer.ggml.tokens")
        merges = _gguf_field(reader, "tokenizer.ggml.merges")
        if not tokens:
            raise ValueError(f"{where}: tokenizer.ggml.tokens is missing or empty")
        if not merges:
            raise ValueError(f"{where}: tokenizer.ggml.merges is missing or empty")
        token_types: list[int] = _gguf_field(reader, "tokenizer.ggml.token_type") or []

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

        def named(key: str) -> str | None:
            token_id = _gguf_field(reader, f"tokenizer.ggml.{key}")
            if token_id is None:
                return None
            if not 0 <= token_id < len(tokens):
                raise ValueError(f"{where}: tokenizer.ggml.{key} {token_id} is out of range")
            return str(tokens[token_id])

        bos_token, eos_token = named("bos_token_id"), named("eos_token_id")
        # Control tokens are matched whole and are special; a control token written outside the
        # byte alphabet is a llama.cpp mislabel and is skipped, as transformers does.
        specials = [
            token
            for token, kind in zip(tokens, token_types, strict=False)
            if kind == _TOKEN_TYPE_CONTROL and set(token) <= alphabet
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
            [
                AddedToken(token, normalized=False, special=True)
                for token in specials + named_specials
            ]
        )
        user_defined = [
            AddedToken(token, normalized=False, special=False)
            for token, kind in zip(tokens, token_types, strict=False)
            if kind == _TOKEN_TYPE_USER_DEFINED and token in vocab
        ]
        if user_defined:
            backend.add_tokens(user_defined)
        backend.post_processor = _post_processor(
            bos_token,
            None if bos_token is None else backend.token_to_id(bos_token),
            eos_token,
            None if eos_token is None else backend.token_to_id(eos_token),
            add_bos_token=bool(_gguf_field(reader, "tokenizer.ggml.add_bos_token") or False),
            add_eos_token=bool(_gguf_field(reader, "tokenizer.ggml.add_eos_token") or False),
        )
        template = _gguf_field(reader, "tokenizer.chat_template")
        return cls(
            backend,
            bos_token=bos_token,
            eos_token=eos_token,
            chat_template=None if template is None else str(template),
        )

    # ---------------------------------------------------------------- ids

    @property
    def backend(self) -> _Backend:
        """The underlying `tokenizers.Tokenizer` (read it; do not reconfigure it)."""
        return self._backend

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special tokens written in the text are always matched whole."""
        return list(self._backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def encode_batch(
        self, texts: Sequence[str], *, add_special_tokens: bool = True
    ) -> list[list[int]]:
        """`encode` over many texts at once (parallel inside the tokenizers library)."""
        encodings = self._backend.encode_batch_fast(
            list(texts), add_special_tokens=add_special_tokens
        )
        return [list(encoding.ids) for encoding in encodings]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `token_ids`; bytes of an incomplete UTF-8 sequence decode to U+FFFD."""
        return str(self._backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def decode_batch(
        self, batch: Sequence[Sequence[int]], *, skip_special_tokens: bool = True
    ) -> list[str]:
        """`decode` over many id lists at once."""
        return list(
            self._backend.decode_batch(
                [list(ids) for ids in batch], skip_special_tokens=skip_special_tokens
            )
        )

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary entry or added token, None when absent."""
        token_id = self._backend.token_to_id(token)
        return None if token_id is None else int(token_id)

    # ---------------------------------------------------------------- chat

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt text for `messages`. Raises ChatTemplateError when there is no template,
        the messages are malformed, or the template fails."""
        if self.chat_template is None:
            raise ChatTemplateError("the tokenizer has no chat template")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Render then encode without adding special tokens (the template writes them)."""
        prompt = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        return self.encode(prompt, add_special_tokens=False)

    # ---------------------------------------------------------------- saving

    def save_pretrained(self, folder: Path) -> None:
        """Write `tokenizer.json` and `tokenizer_config.json` into `folder` (created if needed),
        readable by `from_hf_folder` and by `transformers.AutoTokenizer`."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(folder / "tokenizer.json"))
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "clean_up_tokenization_spaces": False,
            "model_max_length": 1 << 30,
        }
        if self.chat_template is not None:
            config["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(
            json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )
