"""Rendering chat messages into a prompt string with a model's Jinja chat template.

Renders exactly as Hugging Face `transformers` does (`apply_chat_template(..., tokenize=False)`):
an `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `{% generation %}` block tag (rendered as its body), the globals `raise_exception`,
`strftime_now`, `dict` and a `namespace` that refuses underscore names, and a `tojson` filter that
does not escape HTML. The template sees `messages`, `tools=None`, `documents=None`,
`add_generation_prompt`, `bos_token`, `eos_token` and any extra keyword.

Every failure -- malformed messages, a template that does not compile, a template that raises --
is a `ChatTemplateError`, so a caller can turn it into an error row. Compiled templates are cached
per template string by a pure compile function; there is no other state.

Imports jinja2 only; nothing of ours.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplateError", "render_chat_template", "validate_messages"]

# Names a message's reasoning goes by; transformers fills all of them from whichever is set.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """Messages the template cannot take, or a template that fails to compile or render."""


def validate_messages(messages: object) -> list[dict[str, Any]]:
    """Check `messages` and return plain-dict copies (the caller's objects are never mutated).

    Each message is a mapping with a str `role` and a `content` that is a str or a list of
    `{"type": "text", "text": str}` parts; other keys pass through, except that keys set to None
    are dropped and reasoning is aliased as transformers does. Raises ChatTemplateError naming
    the offending message index and key.
    """
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ChatTemplateError(
            f"messages must be a list of {{'role', 'content'}} mappings, got {type(messages).__name__}"
        )
    if not messages:
        raise ChatTemplateError("messages must not be empty")
    checked: list[dict[str, Any]] = []
    for idx, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatTemplateError(
                f"messages[{idx}] must be a mapping with 'role' and 'content', "
                f"got {type(message).__name__}"
            )
        if "role" not in message:
            raise ChatTemplateError(f"messages[{idx}] has no 'role'")
        if not isinstance(message["role"], str):
            raise ChatTemplateError(
                f"messages[{idx}]['role'] must be a string, got {type(message['role']).__name__}"
            )
        if "content" not in message:
            raise ChatTemplateError(f"messages[{idx}] has no 'content'")
        content = message["content"]
        if isinstance(content, str):
            plain_content: str | list[dict[str, str]] = content
        elif isinstance(content, list | tuple):
            plain_content = [
                _text_part(idx, part_idx, part) for part_idx, part in enumerate(content)
            ]
        else:
            raise ChatTemplateError(
                f"messages[{idx}]['content'] must be a string or a list of text parts, "
                f"got {type(content).__name__}"
            )
        # As transformers does: keys set to None count as absent, and a message's reasoning is
        # visible under each of its usual names.
        plain = {str(key): value for key, value in message.items() if value is not None}
        plain["content"] = plain_content
        reasoning = next((plain[key] for key in _REASONING_FIELDS if key in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        checked.append(plain)
    return checked


def _text_part(idx: int, part_idx: int, part: object) -> dict[str, str]:
    where = f"messages[{idx}]['content'][{part_idx}]"
    if not isinstance(part, Mapping):
        raise ChatTemplateError(f"{where} must be a mapping, got {type(part).__name__}")
    if part.get("type") != "text":
        raise ChatTemplateError(f"{where} must have type 'text', got {part.get('type')!r}")
    text = part.get("text")
    if not isinstance(text, str):
        raise ChatTemplateError(f"{where}['text'] must be a string, got {type(text).__name__}")
    return {"type": "text", "text": text}


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str | None,
    eos_token: str | None,
    **extra: Any,
) -> str:
    """Render `messages` with `template`; `extra` keywords are visible to the template.

    Raises ChatTemplateError for malformed messages or a template that fails to compile or raises
    while rendering (the original exception is chained).
    """
    checked = validate_messages(messages)
    compiled = _compile(template)
    context: dict[str, Any] = {
        "tools": None,
        "documents": None,
        "bos_token": bos_token,
        "eos_token": eos_token,
        **extra,
    }
    try:
        return compiled.render(
            messages=checked, add_generation_prompt=add_generation_prompt, **context
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError) as exc:
        # Python errors raised by operations inside the template (e.g. `str + list`).
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' does not.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """`dict(...)` inside templates, without exposing the type object itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """A `namespace()` that refuses underscore-prefixed attribute names (no dunder access)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
            )


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask markers): renders the body only."""

    tags = {"generation"}  # noqa: RUF012 (jinja's Extension API declares it as a class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(
            lineno
        )

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return str(caller())


@functools.lru_cache(maxsize=64)
def _compile(template: str) -> jinja2.Template:
    """Compile once per distinct template string; a compile error is not cached."""
    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a string, got {type(template).__name__}")
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    try:
        return env.from_string(template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
