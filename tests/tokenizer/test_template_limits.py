"""The render budget and the size estimates the bounded chat-template sandbox relies on."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jinja2.utils import Namespace

from batchgen.tokenizer.template_limits import (
    MAX_INT_BITS,
    RenderBudget,
    TemplateLimitError,
    TemplateLimits,
    check_binop,
    printf_bound,
    text_size,
)

# Values as chat messages and templates hold them; strings without quotes or backslashes, so
# that their repr inside a container is the string plus its two quotes.
_plain_text = st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="'\"\\"), max_size=20)
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | _plain_text,
    lambda inner: st.lists(inner, max_size=5)
    | st.tuples(inner, inner)
    | st.dictionaries(_plain_text, inner, max_size=4),
    max_leaves=30,
)
num_size_examples = [0]


@given(_values)
def test_text_size_bounds_the_printed_size(value: object) -> None:
    num_size_examples[0] += 1
    size = text_size(value, limit=1 << 40)
    assert size.chars >= len(str(value))
    # stops early past a limit, having counted more than it
    small = text_size(value, limit=3)
    assert small.nodes <= size.nodes
    assert small.chars == size.chars or small.chars > 3


def test_text_size_counts_shared_values_each_time_and_cycles_once() -> None:
    row = ["x" * 100] * 10
    assert text_size([row, row], limit=1 << 40).chars == 2 + 2 * 2 + 2 * (2 + 2 * 10 + 10 * 102)
    ns = Namespace()
    ns["me"] = ns
    size = text_size(ns, limit=1 << 40)
    assert size.chars >= len(repr(ns)) and size.nodes == 4  # ns, its dict, "me", ns again


def budget(max_value_chars: int = 100, max_steps: int = 10_000, clock: list[float] | None = None) -> RenderBudget:
    times = clock if clock is not None else [0.0]
    return RenderBudget(
        TemplateLimits(max_value_chars=max_value_chars, max_steps=max_steps, max_seconds=5.0),
        clock=lambda: times[0],
    )


def test_budget_steps_sizes_and_printed_chars() -> None:
    b = budget(max_steps=10)
    b.spend(10)
    with pytest.raises(TemplateLimitError, match="step limit"):
        b.spend(1)
    b = budget(max_value_chars=100)
    b.check_size(100, "x")
    with pytest.raises(TemplateLimitError, match="x would build a value of 101 characters"):
        b.check_size(101, "x")
    b.produce(60)
    with pytest.raises(TemplateLimitError, match="printed more than 100 characters"):
        b.produce(41)


def test_budget_deadline_is_read_every_256_steps() -> None:
    clock = [0.0]
    b = budget(max_steps=10_000, clock=clock)
    clock[0] = 5.0  # the deadline
    b.spend(255)  # no clock read yet
    with pytest.raises(TemplateLimitError, match="time limit"):
        b.spend(2)


def test_binop_bounds() -> None:
    b = budget(max_value_chars=1000)
    assert check_binop(b, "*", "ab", 500) == 1000
    assert check_binop(b, "*", 500, "ab") == 1000
    assert check_binop(b, "*", "ab", -(10**30)) == 0
    with pytest.raises(TemplateLimitError):
        check_binop(b, "*", "ab", 501)
    with pytest.raises(TemplateLimitError):
        check_binop(b, "*", ["abc"], 200)  # 200 x len("['abc']") > 1000 although only 200 items
    assert check_binop(b, "+", "a" * 600, "b" * 400) == 1000
    with pytest.raises(TemplateLimitError):
        check_binop(b, "+", [0] * 600, [0] * 401)
    assert check_binop(b, "**", 2, MAX_INT_BITS // 2) == 0  # 2 has 2 bits
    with pytest.raises(TemplateLimitError, match="integer power"):
        check_binop(b, "**", 2, MAX_INT_BITS // 2 + 1)
    with pytest.raises(TemplateLimitError, match="integer product"):
        check_binop(b, "*", 1 << MAX_INT_BITS, 3)
    assert check_binop(b, "*", 2.5, 10**30) == 0  # float arithmetic cannot allocate


def test_printf_bound() -> None:
    b = budget(max_value_chars=10_000)
    assert printf_bound(b, "%s-%s", ("ab", "c")) == 5 + 2 * 330 + 3
    assert printf_bound(b, "%(a)s%%", {"a": "xyz"}) == 7 + 330 + 3
    assert printf_bound(b, "%10d", 5) == 4 + 10 + 330 + 3
    with pytest.raises(TemplateLimitError, match="printf width 10001"):
        printf_bound(b, "%10001d", 5)
    with pytest.raises(TemplateLimitError, match="'\\*' widths"):
        printf_bound(b, "%.*f", (3, 1.0))
