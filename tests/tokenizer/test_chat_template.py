"""Chat templates render exactly as transformers renders them; bad input is a ChatTemplateError."""

from __future__ import annotations

import os
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from batchgen.tokenizer.chat_template import ChatTemplateError, render_chat_template
from tests.tiny_models import make_tiny_hf_folder, smollm2_tokenizer

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Another, with émoji 🙂?"},
]

# Features real templates use: bos_token, namespace, loop controls, tojson, raise_exception,
# content given as a list of text parts, the {% generation %} tag, whitespace control.
LLAMA3_LIKE = """{{- bos_token }}
{%- set ns = namespace(system='') %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}{% set ns.system = message['content'] %}{% continue %}{% endif %}
    {%- if message['role'] not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + message['role']) }}{% endif %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}
    {%- if message['content'] is string %}{{ message['content'] | trim }}
    {%- else %}{% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}
    {{- '<|eot_id|>' }}
{%- endfor %}
{%- if ns.system %}[system: {{ ns.system | tojson }}]{% endif %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}
"""

JSON_DUMP = "{{ messages | tojson(indent=2) }}|{{ messages | length }}|{{ eos_token }}"

GENERATION_TAG = """{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}
{% endfor %}"""

DICT_AND_BREAK = """{% set d = dict(a=1) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.role }}={{ d.a }};{% endfor %}"""


def transformers_render(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    # Annotated as returning str, it returns (rendered conversations, generation indices).
    result: Any = render_jinja_template([messages], chat_template=template, **kwargs)
    return str(result[0][0])


def test_gguf_template_matches_transformers_apply_chat_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = smollm2_tokenizer()
    reference = AutoTokenizer.from_pretrained(make_tiny_hf_folder(tmp_path))
    assert reference.chat_template == tokenizer.chat_template
    for messages in (CONVERSATION, CONVERSATION[1:], CONVERSATION[:2]):
        for add_generation_prompt in (True, False):
            expected = reference.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert (
                tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
                == expected
            )


def test_none_keys_and_reasoning_fields_as_transformers(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    template = (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% if m.tool_calls is defined %}[tools]{% endif %}"
        "{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}|{{ m.thinking }}"
        "</think>{% endif %}\n{% endfor %}"
    )
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "q", "tool_calls": None},
        {"role": "assistant", "content": "a", "reasoning": "because"},
    ]
    reference = AutoTokenizer.from_pretrained(make_tiny_hf_folder(tmp_path))
    expected = reference.apply_chat_template(messages, chat_template=template, tokenize=False)
    ours = render_chat_template(
        template, messages, add_generation_prompt=False, bos_token=None, eos_token=None
    )
    # trim_blocks eats the newline after each closing block tag
    assert ours == expected == "user:qassistant:a<think>because|because</think>"
    assert messages[0] == {"role": "user", "content": "q", "tool_calls": None}


def test_gguf_template_renders_the_expected_prompt() -> None:
    tokenizer = smollm2_tokenizer()
    assert tokenizer.apply_chat_template(CONVERSATION[1:2]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nName a prime.<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "template", [LLAMA3_LIKE, JSON_DUMP, GENERATION_TAG, DICT_AND_BREAK], ids=lambda t: t[:12]
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_matches_transformers(template: str, add_generation_prompt: bool) -> None:
    messages: list[dict[str, Any]] = [
        *CONVERSATION,
        {"role": "assistant", "content": [{"type": "text", "text": '<b>11</b> & "13"'}]},
    ]
    ours = render_chat_template(
        template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )
    expected = transformers_render(
        template,
        messages,
        add_generation_prompt=add_generation_prompt,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
    )
    assert ours == expected


def test_extra_keywords_reach_the_template() -> None:
    template = "{{ greeting }} {{ messages[0].content }}{% if tools is none %} no tools{% endif %}"
    out = render_chat_template(
        template,
        [{"role": "user", "content": "x"}],
        add_generation_prompt=True,
        bos_token=None,
        eos_token=None,
        greeting="hey",
    )
    assert out == "hey x no tools"


def test_read_only_mappings_and_tuples_are_accepted_and_not_mutated() -> None:
    message = MappingProxyType({"role": "user", "content": "hi", "name": "bob"})
    out = render_chat_template(
        "{{ messages[0].name }}:{{ messages[0].content }}",
        (message,),
        add_generation_prompt=False,
        bos_token=None,
        eos_token=None,
    )
    assert out == "bob:hi"
    assert dict(message) == {"role": "user", "content": "hi", "name": "bob"}


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ("just a string", "must be a list"),
        ({"role": "user", "content": "hi"}, "must be a list"),
        (None, "must be a list"),
        ([], "must not be empty"),
        (["hi"], r"messages\[0\] must be a mapping"),
        ([{"content": "hi"}], r"messages\[0\] has no 'role'"),
        ([{"role": "user"}], r"messages\[0\] has no 'content'"),
        ([{"role": 1, "content": "hi"}], r"messages\[0\]\['role'\] must be a string"),
        (
            [{"role": "user", "content": "ok"}, {"role": "user", "content": 5}],
            r"messages\[1\]\['content'\] must be a string",
        ),
        ([{"role": "user", "content": None}], r"\['content'\] must be a string"),
        ([{"role": "user", "content": [{"type": "image", "url": "x"}]}], "must have type 'text'"),
        (
            [{"role": "user", "content": [{"type": "text", "text": 3}]}],
            r"\['text'\] must be a string",
        ),
        ([{"role": "user", "content": ["plain"]}], r"\['content'\]\[0\] must be a mapping"),
    ],
)
def test_bad_messages_raise(messages: Any, match: str) -> None:
    with pytest.raises(ChatTemplateError, match=match):
        render_chat_template(
            "{{ messages }}", messages, add_generation_prompt=True, bos_token=None, eos_token=None
        )


def test_tokenizer_rejects_bad_messages_too() -> None:
    with pytest.raises(ChatTemplateError, match="no 'role'"):
        smollm2_tokenizer().encode_chat([{"content": "hi"}])


def test_raise_exception_in_template_raises() -> None:
    with pytest.raises(ChatTemplateError, match="bad role tool"):
        render_chat_template(
            LLAMA3_LIKE,
            [{"role": "tool", "content": "x"}],
            add_generation_prompt=True,
            bos_token="<s>",
            eos_token="</s>",
        )


def test_template_that_does_not_compile_raises() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat_template(
            "{% for m in messages %}{{ m }}",
            [{"role": "user", "content": "x"}],
            add_generation_prompt=True,
            bos_token=None,
            eos_token=None,
        )


def test_python_error_inside_template_raises() -> None:
    # SmolLM2's template concatenates content as a string; a list of parts is a TypeError there.
    with pytest.raises(ChatTemplateError, match="TypeError"):
        smollm2_tokenizer().apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        )


@pytest.mark.parametrize(
    "template",
    [
        "{{ messages.__class__.__mro__ }}",
        "{% set ns = namespace(_x=1) %}{{ ns }}",
        "{{ messages.append(1) }}",
    ],
)
def test_sandbox_violations_raise(template: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat_template(
            template,
            [{"role": "user", "content": "x"}],
            add_generation_prompt=True,
            bos_token=None,
            eos_token=None,
        )


def test_strftime_now_is_available() -> None:
    out = render_chat_template(
        "{{ strftime_now('%Y') }}",
        [{"role": "user", "content": "x"}],
        add_generation_prompt=True,
        bos_token=None,
        eos_token=None,
    )
    assert out.isdigit() and len(out) == 4


def test_tokenizer_without_template_raises(tmp_path: Path) -> None:
    from batchgen.tokenizer.tokenizer import Tokenizer

    tokenizer = smollm2_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    config_file = tmp_path / "tokenizer_config.json"
    config_file.write_text(config_file.read_text().replace('"chat_template"', '"unused"'))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        Tokenizer.from_hf_folder(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
