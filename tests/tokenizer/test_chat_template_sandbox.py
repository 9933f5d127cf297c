"""Hostile chat templates end as ChatTemplateError, within bounded memory and time, and the
bounded sandbox renders normal templates exactly as transformers does (issue 20, defect 10)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.tokenizer.chat_template import (
    ChatTemplateError,
    ChatTemplateTooLong,
    render_chat_template,
)
from tests.tokenizer.test_chat_template import CONVERSATION, transformers_render

MESSAGES = [{"role": "user", "content": "x"}]


def render(template: str, **kwargs: Any) -> str:
    return render_chat_template(
        template, MESSAGES, add_generation_prompt=False, bos_token=None, eos_token=None, **kwargs
    )


# (template, a fragment of the error message); each escaped render_chat_template before, as
# the exception named first, ran for minutes, or allocated gigabytes.
HOSTILE = [
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ("{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", "RecursionError"),
    ("{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}", "step limit"),
    ("{{ 'a' * 2**64 }}", "'*' would build a value of 18446744073709551616"),
    ("{{ 'a' * 10**10 }}", "'*' would build a value of 10000000000"),
    ("{{ [1, 2] * 10**9 }}", "'*' would build a value of 2000000000"),
    ("{{ (['x' * 1000] * 1000) * 100 }}", "'*' would build"),
    ("{{ range(10**12) | length }}", "OverflowError: Range too big"),
    ("{{ 2 ** 100000 }}", "integer power"),
    ("{{ (10 ** 4000) * (10 ** 4000) * (10 ** 4000) * (10 ** 4000) * (10 ** 4000) * (10 ** 4000) }}", "integer product"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", "'~' would build"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'+' would build"),
    ("{% set ns = namespace(s=[1]) %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", "'+' would build"),
    ("{{ '%0999999999d' % 1 }}", "printf width 999999999"),
    ("{{ '%.999999999f' % 1.0 }}", "printf precision 999999999"),
    ("{{ '%*d' % (10**9, 1) }}", "'*' widths are not allowed"),
    ("{{ '%(a)s%(a)s%(a)s%(a)s%(a)s' % {'a': 'x' * 1000000} }}", "printf-style format would build"),
    ("{{ '%0999999999d' | format(1) }}", "printf width 999999999"),
    ("{{ '{:>999999999}'.format(1) }}", "format width 999999999"),
    ("{{ '{:>{w}}'.format(1, w=10**9) }}", "format width 1000000000"),
    ("{{ '{0}{0}{0}{0}{0}'.format('x' * 1000000) }}", "str.format would build"),
    ("{{ '{a}{a}{a}{a}{a}'.format_map({'a': 'x' * 1000000}) }}", "str.format would build"),
    ("{{ 'x'.center(10**19) }}", "str.center would build"),
    ("{{ 'x'.zfill(10**9) }}", "str.zfill would build"),
    ("{{ 'a\\tb'.expandtabs(10**9) }}", "str.expandtabs would build"),
    ("{{ ('x' * 100000).replace('x', 'y' * 1000) }}", "str.replace would build"),
    ("{{ ('x' * 1000000).join(['a'] * 100) }}", "str.join would build"),
    ("{{ 'abc'.translate({97: 'x' * 10**7}) }}", "'*' would build"),
    ("{{ 'x' | center(10**9) }}", "center would build"),
    ("{{ ('a\\n' * 100000) | indent(1000) }}", "indent would build"),
    ("{{ ('x' * 100000) | replace('x', 'y' * 1000) }}", "replace would build"),
    ("{{ (['x' * 1000000] * 4) | join('-' * 100000) }}", "join would build"),
    ("{{ 'ab' | wordwrap(1, wrapstring='x' * 3000000) }}", "wordwrap would build"),
    ("{{ [1] | batch(10**9, 0) | list }}", "batch size 1000000000"),
    ("{{ [1] | slice(10**7) | list }}", "number of slices 10000000"),
    ("{{ lipsum(10**6) }}", "lipsum paragraphs 1000000"),
    ("{{ lipsum(5000) }}", "lipsum would build"),
    ("{% set a = ['x' * 1000] * 1000 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}{{ [b, b, b, b, b, b, b, b, b, b] }}", "printed more than"),
    ("{% set a = ['x' * 1000] * 1000 %}{% set b = [a, a, a, a, a, a, a, a, a, a] %}{{ b | tojson }}", "tojson would build"),
    ("{% set a = ['x' * 1000] * 1000 %}{{ [a, a, a, a, a, a, a, a, a, a] | string }}", "string would build"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "step limit"),
    ("{% for i in range(100000) %}{% for j in range(100000) if false %}{% endfor %}{% endfor %}", "step limit"),
    ("{% for a in 'x' * 1000000 %}{% for b in 'x' * 1000000 %}{% endfor %}{% endfor %}", "step limit"),
    ("{% set x %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endset %}", "printed more than"),
    ("{% set x %}{% for i in range(100000) %}" + "z" * 500 + "{% endfor %}{% endset %}", "printed more than"),
    ("{% macro m() %}" + "z" * 500 + "{% endmacro %}{% set x %}{% for i in range(100000) %}{{ m() }}{% endfor %}{% endset %}", "printed more than"),
    ("{% set ns = namespace() %}{% set ns.me = ns %}{% for i in range(100000) %}{{ ns }}{{ ns }}{% endfor %}", "printed more than"),
    ("{{ 10 ** 5000 }}", "ValueError: Exceeds the limit"),
    ("{{ 1 / 0 }}", "ZeroDivisionError"),
    ("{{ messages.__class__.__mro__ }}", "unsafe"),
    ("{{ ((((((((((((((((((((1)))))))))))))))))))) ~ x[0][0][0] }}", "'x' is undefined"),
]


@pytest.mark.parametrize(("template", "match"), HOSTILE, ids=[t[:40] for t, _ in HOSTILE])
def test_hostile_templates_are_chat_template_errors(template: str, match: str) -> None:
    with pytest.raises(ChatTemplateError) as caught:
        render(template)
    assert match in str(caught.value)
    assert not isinstance(caught.value, ChatTemplateTooLong)


def test_a_template_nested_too_deep_to_compile_is_an_error() -> None:
    with pytest.raises(ChatTemplateError, match="does not compile: RecursionError"):
        render("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}")


def test_output_is_capped_exactly() -> None:
    template = "{% for i in range(10) %}{{ 'abcdefghij' }}{% endfor %}"
    assert render(template, max_output_chars=100) == "abcdefghij" * 10
    with pytest.raises(ChatTemplateTooLong, match="more than 99 characters"):
        render(template, max_output_chars=99)
    # a template printing without end stops at the cap, not at a memory or step limit
    with pytest.raises(ChatTemplateTooLong, match="more than 1000 characters"):
        render("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}", max_output_chars=1000)


def test_big_inputs_render_whole() -> None:
    # The value limit scales with the messages, so a long message passes the template's `+`.
    content = "word " * 2_000_000  # 10 M characters, over the 4 Mi floor
    template = "{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + '</>' }}{% endfor %}"
    out = render_chat_template(
        template,
        [{"role": "user", "content": content}],
        add_generation_prompt=False,
        bos_token=None,
        eos_token=None,
        max_output_chars=20_000_000,
    )
    assert out == "<user>" + content + "</>"


# Features real templates use, rendered through every instrumented construct: loops with else,
# loop.length/revindex/last/cycle, filtered and recursive loops, macros with caller and
# varargs, call blocks, set blocks, `~`, printf and str.format, widening filters within limits.
PARITY_TEMPLATES = [
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}/{{ loop.length }}:{{ m.role ~ '=' ~ m.content }}"
    "{% if not loop.last %}|{% endif %}{% else %}none{% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %}{% for c in 'abc' %}{{ loop.cycle('-', '+') }}{{ c }}{{ loop.revindex }}{% endfor %}",
    "{% macro row(m, sep) %}{{ m.role | upper }}{{ sep }}{{ caller() if caller else '' }}{{ varargs | length }}{% endmacro %}"
    "{% for m in messages %}{% call row(m, ': ', 1, 2) %}{{ m.content | trim | center(30) }}{% endcall %}\n{% endfor %}",
    "{% set ns = namespace(out='', n=0) %}{% for m in messages %}{% set ns.out = ns.out + m.content[:3] %}"
    "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.out }}{{ ns.n * 2 ** 3 }}{{ '%05.1f|%-6s|%(x)s' % (3.14159, 'ab', ) if false else '%05.1f|%-6s' % (3.14159, 'ab') }}",
    "{{ '{:>8}|{:^9}|{!r}'.format('a', messages[0].role, 'q') }}{{ '{name}!'.format_map({'name': 'z'}) }}"
    "{{ '%s-%d' | format('k', 7) }}{{ messages | map(attribute='role') | join(', ') }}",
    "{% set block %}{% for m in messages %}[{{ m.content | replace('e', 'E') | wordwrap(10) }}]{% endfor %}{% endset %}"
    "{{ block | indent(2, first=True) }}{{ messages | tojson(indent=2) }}{{ messages[:2] | pprint }}",
    "{% for item in [[1, [2, 3]], [4]] recursive %}({% if item is iterable %}{{ loop(item) }}{% else %}{{ item }}{% endif %}){% endfor %}"
    "{{ [1, 2, 3] | batch(2, 0) | list }}{{ [1, 2, 3, 4] | slice(3) | list }}{{ [[1], [2]] | sum(start=[]) }}"
    "{{ ('ab' * 3) ~ ([0] * 3) | string }}{{ 'x\\ty'.expandtabs(4) }}{{ '7'.zfill(3) }}{{ '-'.join(['a', 'b']) }}",
]


@pytest.mark.parametrize("template", PARITY_TEMPLATES, ids=lambda t: t[:30])
def test_instrumented_constructs_render_as_transformers(template: str) -> None:
    ours = render_chat_template(
        template, CONVERSATION, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )
    assert ours == transformers_render(
        template, CONVERSATION, add_generation_prompt=True, bos_token="<s>", eos_token="</s>"
    )


# Fragments of hostile templates: each is a statement or an output; `{X}` is replaced by an
# expression fragment. Composed at random, every render returns text within the cap or
# raises ChatTemplateError -- never another exception, never past the cap.
_EXPRESSIONS = [
    "'a' * 2**64", "'ab' * 1000", "[1] * 10**6", "[x] * 3", "range(10**12)", "range(3)",
    "9 ** 9 ** 9", "2 ** 100", "'%*d' % (5, 1)", "'%0999999999d' % 1", "'%s' % x", "'{:>99999999}'.format(1)",
    "'{0}{0}'.format(x)", "x ~ x", "x + x", "x | center(10**8)", "x | indent(10**7)", "x | tojson(indent=100000)",
    "lipsum(10**6)", "x.replace('a', x)", "x.center(10**9)", "messages[0].content", "messages | length",
    "namespace(a=1)", "dict(a=x)", "x[::-1]", "1 / 0", "undefined_name.attr", "messages[9]", "x | int",
    "[x, x, x, x]", "(x, x) | string", "x | list | join(x)", "x.split()", "cycler(1, 2).next()",
]
_STATEMENTS = [
    "{% set x = {E} %}", "{{ {E} }}", "{% for i in range(1000) %}{{ {E} }}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = {E} %}{% endfor %}{% endfor %}",
    "{% set ns.s = ns.s ~ ns.s %}", "{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "{% if {E} %}y{% endif %}",
    "{% set b %}{% for i in range(100000) %}{{ x }}{% endfor %}{% endset %}", "{{ raise_exception('no') }}",
    "{% for i in ({E}) %}{{ i }}{% endfor %}",
]
_MAX_OUTPUT_CHARS = 100_000
num_fuzz_examples = [0]


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(st.sampled_from(_STATEMENTS), st.sampled_from(_EXPRESSIONS)), min_size=1, max_size=4
    )
)
def test_fuzzed_hostile_templates_never_escape(parts: list[tuple[str, str]]) -> None:
    num_fuzz_examples[0] += 1
    template = "{% set x = 'abc' %}{% set ns = namespace(s='ab') %}" + "".join(
        statement.replace("{E}", expression) for statement, expression in parts
    )
    try:
        out = render(template, max_output_chars=_MAX_OUTPUT_CHARS)
    except ChatTemplateError:
        return
    assert len(out) <= _MAX_OUTPUT_CHARS
