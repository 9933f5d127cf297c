"""Rendering chat messages into a prompt string with a model's Jinja chat template.

Renders exactly as Hugging Face `transformers` does (`apply_chat_template(..., tokenize=False)`):
an `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks`, the `loopcontrols`
extension, a `{% generation %}` block tag (rendered as its body), the globals `raise_exception`,
`strftime_now`, `dict` and a `namespace` that refuses underscore names, and a `tojson` filter that
does not escape HTML. The template sees `messages`, `tools=None`, `documents=None`,
`add_generation_prompt`, `bos_token`, `eos_token` and any extra keyword (`render_checked_messages`
takes messages already validated, and template kwargs that count toward the limits below; chat
options are applied by `batchgen.tokenizer.chat_options`).

Every failure -- malformed messages, a template that does not compile, a template that raises
any exception (RecursionError, OverflowError, MemoryError included) or passes a limit -- is a
`ChatTemplateError`, so a caller can turn it into an error row. Compiled templates are cached
per template string by a pure compile function; there is no other state.

Limits (`template_sandbox`, `template_limits`): the render is streamed and stops with
`ChatTemplateTooLong` once the output passes `max_output_chars` (default
`DEFAULT_MAX_OUTPUT_CHARS` = 8 Mi characters; the prepare stage passes its own bound from
max_model_len). Any value the template builds, and all it prints, is capped at
`max(MIN_VALUE_CHARS, 4 x the printed size of the messages and template kwargs)` characters (4 Mi at least), so a
huge conversation still renders while `"a" * 10**10` does not; a render may take
`BASE_STEPS + STEPS_PER_INPUT_NODE x (values in the messages and template kwargs)` steps (loop iterations, calls,
operators, printed values) and `MAX_SECONDS` of wall time.

Imports jinja2 and the tokenizer package's template_sandbox / template_limits modules.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Generator, Mapping, Sequence
from datetime import datetime
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils

from batchgen.tokenizer.template_limits import RenderBudget, TemplateLimits, text_size
from batchgen.tokenizer.template_sandbox import BUDGET_KEY, BoundedSandbox, compile_bounded

__all__ = [
    "DEFAULT_MAX_OUTPUT_CHARS",
    "ChatTemplateError",
    "ChatTemplateTooLong",
    "compile_chat_template",
    "render_chat_template",
    "render_checked_messages",
    "validate_messages",
]

DEFAULT_MAX_OUTPUT_CHARS = 8 << 20
MIN_VALUE_CHARS = 4 << 20
BASE_STEPS = 200_000
STEPS_PER_INPUT_NODE = 1_000
MAX_SECONDS = 10.0

# Names a message's reasoning goes by; transformers fills all of them from whichever is set.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """Messages the template cannot take, or a template that fails to compile or render."""


class ChatTemplateTooLong(ChatTemplateError):
    """The rendered text is longer than the `max_output_chars` the caller allowed."""


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
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    **extra: Any,
) -> str:
    """Render `messages` with `template`; `extra` keywords are visible to the template.

    Raises ChatTemplateTooLong once the output passes `max_output_chars` characters, and
    ChatTemplateError for malformed messages, a template that fails to compile, raises any
    exception while rendering (chained) or passes a limit of the module docstring.
    """
    return render_checked_messages(
        template,
        validate_messages(messages),
        add_generation_prompt=add_generation_prompt,
        bos_token=bos_token,
        eos_token=eos_token,
        max_output_chars=max_output_chars,
        extra=extra,
    )


def render_checked_messages(
    template: str,
    checked: list[dict[str, Any]],
    *,
    add_generation_prompt: bool,
    bos_token: str | None,
    eos_token: str | None,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    template_kwargs: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """`render_chat_template` of messages that `validate_messages` returned. `template_kwargs`
    (plain data, e.g. a chat option's) count with the messages toward the value and step
    limits; `extra` (e.g. a pinned `strftime_now`) does not. Both are visible to the template;
    neither may replace `messages` or `add_generation_prompt`. Raises as `render_chat_template`."""
    compiled = _compile(template)
    data = dict(template_kwargs or {})
    input_size = text_size([checked, data] if data else checked, limit=1 << 62)
    limits = TemplateLimits(
        max_value_chars=max(MIN_VALUE_CHARS, 4 * input_size.chars),
        max_steps=BASE_STEPS + STEPS_PER_INPUT_NODE * input_size.nodes,
        max_seconds=MAX_SECONDS,
    )
    context: dict[str, Any] = {
        "tools": None,
        "documents": None,
        "bos_token": bos_token,
        "eos_token": eos_token,
        **data,
        **(extra or {}),
        "messages": checked,
        "add_generation_prompt": add_generation_prompt,
        BUDGET_KEY: RenderBudget(limits),
    }
    try:
        return _stream(compiled, context, max_output_chars)
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
    except Exception as exc:
        # Whatever Python raises inside the template (`str + list`, a recursive macro, an
        # overflow, memory): the row fails, not the job.
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc


def _stream(compiled: jinja2.Template, context: dict[str, Any], max_output_chars: int) -> str:
    chunks: list[str] = []
    num_chars = 0
    stream = compiled.generate(context)
    assert isinstance(stream, Generator)  # Template.generate is a generator function
    try:
        for chunk in stream:
            num_chars += len(chunk)
            if num_chars > max_output_chars:
                raise ChatTemplateTooLong(
                    f"the chat template renders more than {max_output_chars} characters"
                )
            chunks.append(chunk)
    finally:
        stream.close()
    return "".join(chunks)


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


def compile_chat_template(template: str) -> None:
    """Check that `template` compiles (the compiled template is cached for the renders);
    raises ChatTemplateError when it does not."""
    _compile(template)


@functools.lru_cache(maxsize=64)
def _compile(template: str) -> jinja2.Template:
    """Compile once per distinct template string; a compile error is not cached."""
    if not isinstance(template, str):
        raise ChatTemplateError(f"chat template must be a string, got {type(template).__name__}")
    env = BoundedSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        filters={"tojson": _tojson},
        globals_={
            "raise_exception": _raise_exception,
            "strftime_now": _strftime_now,
            "dict": _TemplateDict(),
            "namespace": _TemplateNamespace,
        },
        unbudgeted_value_chars=MIN_VALUE_CHARS,
    )
    try:
        compiled: jinja2.Template = compile_bounded(env, template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
    except Exception as exc:  # e.g. RecursionError from a template nested thousands deep
        raise ChatTemplateError(f"chat template does not compile: {type(exc).__name__}: {exc}") from exc
    return compiled
