"""Size checks for the jinja filters and globals that can build more than their inputs hold.

Each check takes the render's `RenderBudget` and the filter's own arguments (same names and
defaults as jinja's), raises `TemplateLimitError` when the result's upper bound passes the
value limit, and returns the value to filter (an iterator given to `join` or `sum` becomes a
list, which those filters would build anyway). Filters not listed here build at most a constant
factor times their input (`upper`, `escape`, `list`, `map`, `sort`, ...) and are only checked
after they ran.

Imports jinja2 (through `template_limits`) only; nothing else of ours.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from batchgen.tokenizer.template_limits import (
    MAX_COUNT,
    RenderBudget,
    TemplateLimitError,
    printf_bound,
)

__all__ = ["FILTER_CHECKS", "check_lipsum"]

FilterCheck = Callable[..., Any]


def _count(value: object, what: str) -> None:
    if isinstance(value, int) and value > MAX_COUNT:
        raise TemplateLimitError(f"{what} {value} is larger than the chat-template limit {MAX_COUNT}")


def _chars(budget: RenderBudget, value: object) -> int:
    return budget.measure(value).chars


def _materialize(value: Any) -> Any:
    if isinstance(value, str | bytes | list | tuple | Mapping) or not hasattr(value, "__iter__"):
        return value
    return list(value)


def _center(budget: RenderBudget, value: Any, width: Any = 80) -> Any:
    budget.check_size(max(_chars(budget, value), width if isinstance(width, int) else 0), "center")
    return value


def _indent(budget: RenderBudget, s: Any, width: Any = 4, first: Any = False, blank: Any = False) -> Any:
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    lines = s.count("\n") + 1 if isinstance(s, str) else _chars(budget, s) + 1
    budget.check_size(_chars(budget, s) + lines * max(pad, 0), "indent")
    return s


def _format(budget: RenderBudget, value: Any, *args: Any, **kwargs: Any) -> Any:
    text = value if isinstance(value, str) else None
    if text is None:
        budget.check_size(_chars(budget, value), "format")
        text = str(value)
    budget.check_size(printf_bound(budget, text, kwargs or args), "format")
    return value


def _replace(budget: RenderBudget, s: Any, old: Any, new: Any, count: Any = None) -> Any:
    size = _chars(budget, s)
    if isinstance(old, str) and isinstance(new, str) and isinstance(s, str):
        found = len(s) + 1 if not old else s.count(old)
        if isinstance(count, int):
            found = min(found, max(count, 0))
        size += found * len(new)
    else:
        size *= 1 + _chars(budget, new)
    budget.check_size(size, "replace")
    return s


def _join(budget: RenderBudget, value: Any, d: Any = "", attribute: Any = None) -> Any:
    items = _materialize(value)
    sep = _chars(budget, d)
    num_items = len(items) if hasattr(items, "__len__") else 0
    budget.check_size(_chars(budget, items) + num_items * sep, "join")
    return items


def _wordwrap(
    budget: RenderBudget,
    s: Any,
    width: Any = 79,
    break_long_words: Any = True,
    wrapstring: Any = None,
    break_on_hyphens: Any = True,
) -> Any:
    size = _chars(budget, s)
    wrap = len(wrapstring) if isinstance(wrapstring, str) else 1
    budget.check_size(size + (size + 1) * wrap, "wordwrap")
    return s


def _batch(budget: RenderBudget, value: Any, linecount: Any, fill_with: Any = None) -> Any:
    _count(linecount, "batch size")
    return value


def _slice(budget: RenderBudget, value: Any, slices: Any, fill_with: Any = None) -> Any:
    _count(slices, "number of slices")
    return value


def _tojson(
    budget: RenderBudget,
    x: Any,
    ensure_ascii: Any = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: Any = False,
) -> Any:
    size = budget.measure(x)
    pad = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    seps = sum(len(s) for s in separators if isinstance(s, str)) if isinstance(separators, list | tuple) else 2
    # JSON escapes take up to 6 characters (\u00NN), 12 for an astral character in ASCII.
    per_char = 12 if ensure_ascii else 6
    budget.check_size(per_char * size.chars + size.nodes * (max(pad, 0) * size.depth + seps + 4), "tojson")
    return x


def _string(budget: RenderBudget, value: Any) -> Any:
    budget.check_size(_chars(budget, value), "string")
    return value


def _pprint(budget: RenderBudget, value: Any) -> Any:
    size = budget.measure(value)
    budget.check_size(2 * size.chars + size.nodes * (size.depth + 4), "pprint")
    return value


def _urlize(
    budget: RenderBudget,
    value: Any,
    trim_url_limit: Any = None,
    nofollow: Any = False,
    target: Any = None,
    rel: Any = None,
    extra_schemes: Any = None,
) -> Any:
    text = value if isinstance(value, str) else ""
    extra = sum(len(x) for x in (target, rel) if isinstance(x, str)) + 64
    budget.check_size(3 * _chars(budget, value) + len(text.split()) * extra, "urlize")
    return value


def _xmlattr(budget: RenderBudget, d: Any, autospace: Any = True) -> Any:
    size = budget.measure(d)
    budget.check_size(6 * size.chars + 16 * size.nodes, "xmlattr")
    return d


def _sum(budget: RenderBudget, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    items = _materialize(iterable)
    if isinstance(start, list | tuple | str) and isinstance(items, list | tuple):
        budget.check_size(
            len(start) + sum(len(x) for x in items if isinstance(x, list | tuple | str)), "sum"
        )
    return items


def check_lipsum(budget: RenderBudget, n: Any = 5, html: Any = True, min: Any = 20, max: Any = 100) -> None:
    """`lipsum(n, html, min, max)`: n paragraphs of up to max words."""
    for value, what in ((n, "lipsum paragraphs"), (min, "lipsum words"), (max, "lipsum words")):
        _count(value, what)
    if isinstance(n, int) and isinstance(max, int):
        budget.check_size(n * max * 16, "lipsum")


FILTER_CHECKS: Mapping[str, FilterCheck] = {
    "batch": _batch,
    "center": _center,
    "format": _format,
    "indent": _indent,
    "join": _join,
    "pprint": _pprint,
    "replace": _replace,
    "slice": _slice,
    "string": _string,
    "sum": _sum,
    "tojson": _tojson,
    "urlize": _urlize,
    "wordwrap": _wordwrap,
    "xmlattr": _xmlattr,
}
