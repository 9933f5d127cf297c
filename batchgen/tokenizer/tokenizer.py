"""Text <-> token ids for a model, and its chat template, over a Hugging Face `tokenizers` backend.

`Tokenizer` is built from a Hugging Face folder (`tokenizer.json` + `tokenizer_config.json`) or
from a GGUF file's `tokenizer.ggml.*` metadata (`gguf_vocab`): a byte-level BPE vocabulary
(`gpt2`) builds as `transformers` builds it, ids matching token for token; a SentencePiece one
(`llama`) encodes and decodes as its SentencePiece model and llama.cpp do.

Invariants: the backend never truncates or pads; the object is immutable after construction, so
it may be shared by worker threads. `fingerprint` hashes everything that changes ids or prompts.

Imports `tokenizers` and the tokenizer package's chat modules; no torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as _Backend

from batchgen.tokenizer.chat_options import ChatOptions, render_chat
from batchgen.tokenizer.gguf_vocab import GGUFSource, gguf_tokenizer

__all__ = ["Tokenizer"]

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
    def from_gguf(cls, reader: GGUFSource) -> Tokenizer:
        """Build from `tokenizer.ggml.*` metadata (module docstring).

        `tokenizer.ggml.model` must be `gpt2` (byte-level BPE) or `llama` (SentencePiece BPE);
        another model, or missing tokens, merges (gpt2) or scores (llama), raises ValueError
        naming the key.
        """
        parts = gguf_tokenizer(reader)
        return cls(
            parts.backend,
            bos_token=parts.bos_token,
            eos_token=parts.eos_token,
            chat_template=parts.chat_template,
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
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None = None,
        options: ChatOptions | None = None,
    ) -> str:
        """The prompt text for `messages` under `options` (default `ChatOptions()`: the
        tokenizer's template with the generation prompt). `add_generation_prompt` is a shorthand
        for `ChatOptions(add_generation_prompt=...)`; giving it with `options` is a TypeError.
        Raises ChatTemplateError when there is no template, the messages are malformed, or the
        template fails."""
        return render_chat(
            messages,
            _chat_options(add_generation_prompt, options),
            default_template=self.chat_template,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def encode_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool | None = None,
        options: ChatOptions | None = None,
    ) -> list[int]:
        """Render (as `apply_chat_template`) then encode without adding special tokens (the
        template writes them)."""
        prompt = self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, options=options)
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


def _chat_options(add_generation_prompt: bool | None, options: ChatOptions | None) -> ChatOptions:
    if options is None:
        return ChatOptions() if add_generation_prompt is None else ChatOptions(add_generation_prompt=add_generation_prompt)
    if add_generation_prompt is not None:
        raise TypeError("give add_generation_prompt inside options (ChatOptions), not beside it")
    return options
