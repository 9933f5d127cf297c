"""Chat options (vLLM's chat_template, chat_template_kwargs, add_generation_prompt,
continue_final_message): the rendered text equals transformers' `apply_chat_template` with the
same options, and bad options are refused naming the field."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchgen.tokenizer.chat_options import ChatOptions, render_chat
from batchgen.tokenizer.chat_template import ChatTemplateError, ChatTemplateTooLong
from tests.tiny_models import smollm2_tokenizer

# Qwen3's way of turning thinking off: an empty think block after the generation prompt.
QWEN3_LIKE = """{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""

# Trims each message (as Llama 3's template does) and writes list content part by part.
TRIMMING = """{{- bos_token }}
{%- for m in messages %}
{{- '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' }}
{%- if m['content'] is string %}{{ m['content'] | trim }}
{%- else %}{% for part in m['content'] %}{{ part['text'] }}{% endfor %}{% endif %}
{{- '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"""

CHAT: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
]
PARTIAL: list[dict[str, Any]] = [*CHAT, {"role": "assistant", "content": "The smallest odd prime is"}]
PARTIAL_SPACE: list[dict[str, Any]] = [*CHAT, {"role": "assistant", "content": "Seven, and "}]
PARTIAL_PARTS: list[dict[str, Any]] = [
    *CHAT,
    {"role": "assistant", "content": [{"type": "text", "text": "First, "}, {"type": "text", "text": "then 3"}]},
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """transformers' tokenizer over the same tokenizer files (SmolLM2's, with its template)."""
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tok")
    smollm2_tokenizer().save_pretrained(folder)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def _ours(messages: list[dict[str, Any]], **options: Any) -> str:
    tok = smollm2_tokenizer()
    return tok.apply_chat_template(messages, options=ChatOptions.create(**options))


def _theirs(reference: Any, messages: list[dict[str, Any]], **options: Any) -> str:
    kwargs = dict(options.pop("template_kwargs", None) or {})
    template = options.pop("template", None)
    options.setdefault("add_generation_prompt", True)  # transformers' default is False, vLLM's True
    text = reference.apply_chat_template(
        messages, tokenize=False, chat_template=template, **options, **kwargs
    )
    assert isinstance(text, str)
    return text


def test_template_kwargs_reach_the_template_as_in_transformers(reference: Any) -> None:
    thinking = _ours(CHAT, template=QWEN3_LIKE)
    silent = _ours(CHAT, template=QWEN3_LIKE, template_kwargs={"enable_thinking": False})
    assert silent == thinking + "<think>\n\n</think>\n\n"
    assert thinking.endswith("<|im_start|>assistant\n")
    assert silent == _theirs(reference, CHAT, template=QWEN3_LIKE, template_kwargs={"enable_thinking": False})
    assert _ours(CHAT, template=QWEN3_LIKE, template_kwargs={"enable_thinking": True}) == thinking
    # and through the tokenizer's ids: the think block's tokens are added
    tok = smollm2_tokenizer()
    options = ChatOptions.create(template=QWEN3_LIKE, template_kwargs={"enable_thinking": False})
    assert tok.encode_chat(CHAT, options=options) == tok.encode(silent, add_special_tokens=False)


def test_override_template_replaces_the_tokenizers(reference: Any) -> None:
    default = smollm2_tokenizer().apply_chat_template(CHAT)
    assert default.startswith("<|im_start|>system\nYou are terse.")
    overridden = _ours(CHAT, template=TRIMMING)
    assert overridden != default
    assert overridden == _theirs(reference, CHAT, template=TRIMMING)
    assert overridden.startswith("<|im_start|><|start_header_id|>system")  # SmolLM2's BOS
    # the override also serves a tokenizer without a template
    assert render_chat(
        CHAT, ChatOptions.create(template=TRIMMING), default_template=None, bos_token="", eos_token=None
    ).startswith("<|start_header_id|>system")
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_chat(CHAT, ChatOptions(), default_template=None, bos_token=None, eos_token=None)


@pytest.mark.parametrize(
    ("template", "messages"),
    [
        *[(t, m) for t in (None, QWEN3_LIKE, TRIMMING) for m in (PARTIAL, PARTIAL_SPACE)],
        (TRIMMING, PARTIAL_PARTS),  # the others concatenate content as a string
    ],
    ids=["smollm2", "smollm2-space", "qwen3", "qwen3-space", "trimming", "trimming-space", "trimming-parts"],
)
def test_continue_final_message_equals_transformers(
    reference: Any, template: str | None, messages: list[dict[str, Any]]
) -> None:
    options = {"template": template, "add_generation_prompt": False, "continue_final_message": True}
    before = copy.deepcopy(messages)
    ours = _ours(messages, **options)
    assert messages == before  # the tag goes on a copy
    assert ours == _theirs(reference, messages, **options)
    content = messages[-1]["content"]
    final = content if isinstance(content, str) else content[-1]["text"]
    # the text ends with the final message's content (right-trimmed where the template trims),
    # with no end-of-turn after it, and the rest is the chat without the generation prompt
    assert ours.endswith(final) or (template == TRIMMING and ours.endswith(final.rstrip()))
    assert "<|im_end|>" not in ours[-20:] and "<|eot_id|>" not in ours[-20:]
    whole = _ours(messages, template=template, add_generation_prompt=False)
    assert whole.startswith(ours) and len(whole) > len(ours)


def test_continue_from_an_empty_assistant_message() -> None:
    messages = [*CHAT, {"role": "assistant", "content": ""}]
    text = _ours(messages, add_generation_prompt=False, continue_final_message=True)
    assert text == smollm2_tokenizer().apply_chat_template(CHAT)  # SmolLM2: the assistant header


def test_both_booleans_true_are_refused_as_in_transformers(reference: Any) -> None:
    with pytest.raises(ValueError, match=r"ChatOptions\.continue_final_message: expected add_generation_prompt false"):
        ChatOptions.create(continue_final_message=True)
    with pytest.raises(ValueError, match="not compatible"):
        reference.apply_chat_template(
            PARTIAL, tokenize=False, add_generation_prompt=True, continue_final_message=True
        )


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% for m in messages %}{{ m.content | upper }}{% endfor %}", "does not appear in the rendered chat"),
        ("{% for m in messages %}{{ m.role }}{% endfor %}", "never reads 'content'"),
    ],
)
def test_continue_refused_when_the_content_is_not_rendered(template: str, message: str, reference: Any) -> None:
    with pytest.raises(ChatTemplateError, match=message):
        _ours(PARTIAL, template=template, add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(ValueError, match="continue_final_message is set"):
        _theirs(reference, PARTIAL, template=template, add_generation_prompt=False, continue_final_message=True)


def test_continue_keeps_the_output_bound() -> None:
    options = ChatOptions.create(add_generation_prompt=False, continue_final_message=True)
    tok = smollm2_tokenizer()
    text = tok.apply_chat_template(PARTIAL, options=options)

    def render(limit: int) -> str:
        return render_chat(
            PARTIAL, options, default_template=tok.chat_template, bos_token=tok.bos_token,
            eos_token=tok.eos_token, max_output_chars=limit,
        )

    assert render(len(text)) == text
    with pytest.raises(ChatTemplateTooLong):
        render(len(text) - 1)


def test_add_generation_prompt_false() -> None:
    tok = smollm2_tokenizer()
    assert _ours(CHAT, add_generation_prompt=False) == tok.apply_chat_template(CHAT, add_generation_prompt=False)
    assert not _ours(CHAT, add_generation_prompt=False).endswith("<|im_start|>assistant\n")
    with pytest.raises(TypeError, match="inside options"):
        tok.apply_chat_template(CHAT, add_generation_prompt=False, options=ChatOptions())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"template_kwargs": {"messages": []}}, "names the renderer does not set"),
        ({"template_kwargs": {"bos_token": "x"}}, "names the renderer does not set"),
        ({"template_kwargs": {"add_generation_prompt": False}}, "names the renderer does not set"),
        ({"template_kwargs": {"_budget": 1}}, "identifiers not starting with _"),
        ({"template_kwargs": {"enable thinking": 1}}, "identifiers not starting with _"),
        ({"template_kwargs": {"when": object()}}, "expected JSON values"),
        ({"template_kwargs": {"x": float("nan")}}, "expected JSON values"),
        ({"template_kwargs": ["enable_thinking"]}, "expected a mapping"),
        ({"template": "chat.jinja"}, "not a file name"),
        ({"template": "{% for m in messages %}"}, "expected a template that compiles"),
        ({"template": ""}, "expected a Jinja chat template"),
        ({"add_generation_prompt": "yes"}, r"ChatOptions\.add_generation_prompt: expected true or false"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChatOptions.create(**options)


def test_options_are_immutable_values() -> None:
    source: dict[str, Any] = {"b": [1, 2], "a": {"x": True}}
    options = ChatOptions.create(template_kwargs=source)
    source["b"].append(3)
    source["c"] = 1
    assert options.kwargs() == {"a": {"x": True}, "b": [1, 2]}
    assert options == ChatOptions.create(template_kwargs={"a": {"x": True}, "b": [1, 2]})
    assert hash(options) == hash(ChatOptions.create(template_kwargs={"a": {"x": True}, "b": [1, 2]}))
    assert ChatOptions.create().is_default and ChatOptions.from_mapping({"template_kwargs": None}).is_default
    assert not options.is_default
    with pytest.raises(ValueError, match="unknown chat option"):
        ChatOptions.from_mapping({"enable_thinking": False})


def test_template_kwargs_count_toward_the_render_limits(tmp_path: Path) -> None:
    # A kwarg far larger than the messages still renders whole: the value bound grows with it.
    big = "z" * (5 << 20)
    options = ChatOptions.create(template="{{ note }}{{ messages[0].content }}", template_kwargs={"note": big})
    text = render_chat(CHAT, options, default_template=None, bos_token=None, eos_token=None, max_output_chars=6 << 20)
    assert text == big + "You are terse."
