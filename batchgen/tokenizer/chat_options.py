"""Chat options as vLLM and transformers offer them, and rendering a chat with them.

Owns `ChatOptions` (frozen) and `render_chat`. The options, with vLLM's keyword names in
brackets:

- `template` (`chat_template`): a Jinja template string used instead of the tokenizer's;
- `template_kwargs` (`chat_template_kwargs`): extra variables the template sees, such as Qwen3's
  ``enable_thinking: false``; JSON values only, stored as canonical JSON text so the options stay
  immutable, hashable and fingerprintable;
- `add_generation_prompt` (default True): end with the header of a new assistant turn;
- `continue_final_message` (default False): render without the generation prompt and cut the text
  right after the final message's content, so the model continues that message (no end-of-turn
  token after it). Done as transformers 5 does it: a tag is appended to the final message's
  content (its last text part when the content is a list), the chat is rendered, and the text is
  cut where the tag's last occurrence starts (trailing whitespace stripped too when the template
  trimmed the space that ends the tag). `max_output_chars` bounds the cut text; the render
  before the cut may run to twice that, since what follows the final message is cut off.

Invariants (checked in `ChatOptions.__post_init__`, no I/O): an override template compiles; each
`template_kwargs` name is an identifier that does not start with ``_`` and is not one the
renderer sets (`RESERVED_NAMES`: messages, add_generation_prompt, bos_token, eos_token and the
template globals); `add_generation_prompt` and `continue_final_message` are not both True
(transformers and vLLM refuse it). Errors are ValueError ``ChatOptions.<field>: expected ...``;
a render failure is a `ChatTemplateError`, as for `render_chat_template`.

Imports the tokenizer package's chat_template module only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from batchgen.tokenizer.chat_template import (
    DEFAULT_MAX_OUTPUT_CHARS,
    ChatTemplateError,
    ChatTemplateTooLong,
    compile_chat_template,
    render_checked_messages,
    validate_messages,
)

__all__ = ["CHAT_OPTION_KEYS", "RESERVED_NAMES", "ChatOptions", "render_chat"]

# The keys of a job file's `chat:` section and of `generate(chat={...})`.
CHAT_OPTION_KEYS = ("template", "template_kwargs", "add_generation_prompt", "continue_final_message")

# Variables and globals the renderer sets; a template kwarg may not replace them.
RESERVED_NAMES = frozenset(
    {
        "messages",
        "add_generation_prompt",
        "bos_token",
        "eos_token",
        "raise_exception",
        "strftime_now",
        "namespace",
        "dict",
    }
)

# transformers' tag (utils/chat_template_utils.py), so both cut the same text.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


@dataclass(frozen=True, slots=True)
class ChatOptions:
    """How chats are rendered (module docstring). Build it with `create` or `from_mapping`;
    `template_kwargs` holds ``(name, canonical JSON of the value)`` pairs sorted by name."""

    template: str | None = None
    template_kwargs: tuple[tuple[str, str], ...] = ()
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def __post_init__(self) -> None:
        if self.template is not None:
            if not isinstance(self.template, str) or not self.template.strip():
                raise ValueError(
                    f"ChatOptions.template: expected a Jinja chat template (a string), got {self.template!r}"
                )
            if "{{" not in self.template and "{%" not in self.template:
                # e.g. `template: chat.jinja`: a constant would give every row the same prompt.
                raise ValueError(
                    "ChatOptions.template: expected the text of a Jinja chat template (with {{ }} or "
                    f"{{% %}}), not a file name or plain text; got {self.template[:80]!r}"
                )
            try:
                compile_chat_template(self.template)
            except ChatTemplateError as exc:
                raise ValueError(f"ChatOptions.template: expected a template that compiles; {exc}") from exc
        if not isinstance(self.template_kwargs, tuple):
            raise ValueError(
                "ChatOptions.template_kwargs: expected (name, JSON text) pairs; build ChatOptions "
                "with ChatOptions.create(template_kwargs={...})"
            )
        names: list[str] = []
        for pair in self.template_kwargs:
            if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str)):
                raise ValueError(f"ChatOptions.template_kwargs: expected (name, JSON text) pairs, got {pair!r}")
            _check_name(pair[0])
            try:
                json.loads(pair[1])
            except ValueError as exc:
                raise ValueError(f"ChatOptions.template_kwargs: expected JSON text for {pair[0]!r}: {exc}") from exc
            names.append(pair[0])
        if names != sorted(set(names)):
            raise ValueError("ChatOptions.template_kwargs: expected pairs sorted by name, each name once")
        for field in ("add_generation_prompt", "continue_final_message"):
            if not isinstance(getattr(self, field), bool):
                raise ValueError(f"ChatOptions.{field}: expected true or false, got {getattr(self, field)!r}")
        if self.add_generation_prompt and self.continue_final_message:
            raise ValueError(
                "ChatOptions.continue_final_message: expected add_generation_prompt false with it "
                "(the final message is continued, so no new assistant turn is opened; transformers "
                "and vLLM refuse both)"
            )

    @classmethod
    def create(
        cls,
        *,
        template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> ChatOptions:
        """The options with `template_kwargs` given as a mapping of JSON values (copied: later
        changes to the mapping do not reach the options). Raises ValueError naming the field."""
        return cls(
            template=template,
            template_kwargs=_kwargs_pairs(template_kwargs),
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ChatOptions:
        """From a job file's `chat:` section or `generate(chat={...})` (keys `CHAT_OPTION_KEYS`;
        a null value is the default). Raises ValueError for an unknown key or a bad value."""
        if not isinstance(values, Mapping):
            raise ValueError(f"ChatOptions: expected a mapping of {', '.join(CHAT_OPTION_KEYS)}, got {values!r}")
        unknown = sorted(str(key) for key in values if key not in CHAT_OPTION_KEYS)
        if unknown:
            raise ValueError(
                f"unknown chat option(s) {', '.join(unknown)}; expected some of {', '.join(CHAT_OPTION_KEYS)}"
            )
        given = {str(key): value for key, value in values.items() if value is not None}
        return cls.create(**given)

    @property
    def is_default(self) -> bool:
        return self == _DEFAULT

    def kwargs(self) -> dict[str, Any]:
        """A fresh copy of the template kwargs as Python values."""
        return {name: json.loads(text) for name, text in self.template_kwargs}

    def fingerprint(self) -> dict[str, Any]:
        """What a job's fingerprint records: the override template by its SHA-256 (None: the
        tokenizer's, which the tokenizer fingerprint covers), the kwargs and both booleans."""
        return {
            "template_sha256": None
            if self.template is None
            else hashlib.sha256(self.template.encode("utf-8")).hexdigest(),
            "template_kwargs": self.kwargs(),
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }


_DEFAULT = ChatOptions()


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        raise ValueError(
            f"ChatOptions.template_kwargs: expected variable names (identifiers not starting with _), got {name!r}"
        )
    if name in RESERVED_NAMES:
        raise ValueError(
            f"ChatOptions.template_kwargs: expected names the renderer does not set "
            f"({', '.join(sorted(RESERVED_NAMES))}), got {name!r}"
        )


def _kwargs_pairs(values: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    if values is None:
        return ()
    if not isinstance(values, Mapping):
        raise ValueError(f"ChatOptions.template_kwargs: expected a mapping of names to values, got {values!r}")
    pairs: list[tuple[str, str]] = []
    for name, value in values.items():
        _check_name(name)
        try:
            text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"ChatOptions.template_kwargs: expected JSON values (strings, numbers, booleans, null, "
                f"lists, mappings) for {name!r}: {exc}"
            ) from exc
        pairs.append((name, text))
    return tuple(sorted(pairs))


def render_chat(
    messages: Sequence[Mapping[str, Any]],
    options: ChatOptions,
    *,
    default_template: str | None,
    bos_token: str | None,
    eos_token: str | None,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    strftime_now: Callable[[str], str] | None = None,
) -> str:
    """The prompt text of `messages` under `options`; `default_template` is the tokenizer's
    (used when the options name none), `strftime_now` replaces the template's clock.

    Raises ChatTemplateTooLong once the text passes `max_output_chars` characters (with
    continue_final_message: the cut text, or a render before the cut past twice that), and
    ChatTemplateError when there is no template, for malformed messages, a failing template, or
    (continue_final_message) a final message with no text or whose content the rendering lacks.
    """
    template = options.template if options.template is not None else default_template
    if template is None:
        raise ChatTemplateError("the tokenizer has no chat template (give one with the chat template option)")
    checked = validate_messages(messages)
    extra: dict[str, Any] = {} if strftime_now is None else {"strftime_now": strftime_now}
    final_text = ""
    bound = max_output_chars
    if options.continue_final_message:
        final_text = _tag_final_message(template, checked[-1])
        # What follows the final message (its end-of-turn, a template's trailer) is cut off, so
        # the render may run past the bound: twice it, plus the tag, keeps the work bounded.
        bound = 2 * max_output_chars + len(_CONTINUE_TAG)
    rendered = render_checked_messages(
        template,
        checked,
        add_generation_prompt=options.add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
        max_output_chars=bound,
        template_kwargs=options.kwargs(),
        extra=extra,
    )
    if not options.continue_final_message:
        return rendered
    text = _cut_at_tag(rendered, final_text)
    if len(text) > max_output_chars:
        raise ChatTemplateTooLong(f"the chat template renders more than {max_output_chars} characters")
    return text


def _tag_final_message(template: str, message: dict[str, Any]) -> str:
    """Append the tag to the final message's text (in place, on the checked copy); return the
    text as it was."""
    if "content" not in template:
        raise ChatTemplateError(
            "continue_final_message: the chat template never reads 'content', so the final message cannot be continued"
        )
    content = message["content"]
    if isinstance(content, str):
        message["content"] = content + _CONTINUE_TAG
        return content
    if not content:
        raise ChatTemplateError("continue_final_message: the final message has no text to continue")
    last = content[-1]  # validate_messages made every part a fresh {"type": "text", "text": str}
    text: str = last["text"]
    last["text"] = text + _CONTINUE_TAG
    return text


def _cut_at_tag(rendered: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if final_text.strip() not in rendered or tag not in rendered:
        raise ChatTemplateError(
            "continue_final_message: the final message's content does not appear in the rendered chat "
            "(the template drops or changes it), so there is no place to continue it"
        )
    tag_idx = rendered.rindex(tag)
    if rendered[tag_idx : tag_idx + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return rendered[:tag_idx]
    return rendered[:tag_idx].rstrip()  # the template trimmed the tag's space: trim as it would
