"""What one chat-template render may compute: sizes, steps and time, and the bounds that check them.

A render owns one `RenderBudget` (built from frozen `TemplateLimits`); the sandbox
(`template_sandbox`) charges it at every loop iteration, macro body, call, filter, intercepted
operator and printed value. Three things are bounded:

- **value size** (`max_value_chars`): no string, list or tuple a template builds, and no output
  of `*`, `+`, `%`, `~`, `str.format`, a str method or a filter that takes a width or fill
  string, may exceed it. Operations that can amplify (`"a" * n`, `"%*d"`, `"{:>N}"`,
  `center(N)`, `indent`, `replace`, `join`, `tojson(indent=...)`, ...) are checked *before*
  they allocate, from an upper bound of their result (`text_size` estimates `len(str(x))` of
  nested values, up to the repr's constant factor); other results are checked after.
- **produced text** (also `max_value_chars`): characters printed anywhere (the output, `set`
  blocks, macro bodies), so that buffers cannot grow without bound either.
- **steps** (`max_steps`) and **time** (`max_seconds`, wall clock, read every 256 steps, a
  backstop for work between two charges): one step per loop iteration (also one the loop's
  `if` skips), macro or call-block body, call and checked filter, plus one per
  `CHARS_PER_STEP` characters an operation builds, prints or walks. Repeating anything takes a
  loop or a macro, so counting those bounds the number of operations.

Exceeding any of them raises `TemplateLimitError` (a jinja2 `SecurityError`). Integers: `*` and
`**` on ints may not build one above `MAX_INT_BITS` bits.

Imports jinja2 only; nothing of ours.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, ItemsView, KeysView, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any, NamedTuple

from jinja2.exceptions import SecurityError
from jinja2.runtime import Undefined
from jinja2.utils import Namespace

__all__ = [
    "CHARS_PER_STEP",
    "MAX_COUNT",
    "MAX_INT_BITS",
    "RenderBudget",
    "TemplateLimitError",
    "TemplateLimits",
    "TextSize",
    "check_binop",
    "check_format_spec",
    "check_str_method",
    "printf_bound",
    "text_size",
]

CHARS_PER_STEP = 8192  # one step per this many characters an operation produces or scans
MAX_INT_BITS = 1 << 16  # `*` / `**` on ints (str() refuses more than 4300 digits anyway)
MAX_COUNT = 100_000  # lists a filter or lipsum creates from a count (jinja's own MAX_RANGE)
_OBJECT_CHARS = 64  # repr of an object we do not look into (a macro, a datetime, ...)
_CLOCK_EVERY = 256  # steps between two reads of the clock


class TemplateLimitError(SecurityError):
    """A render went past one of its `TemplateLimits`."""


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    """Per-render caps (see the module docstring); all must be positive."""

    max_value_chars: int
    max_steps: int
    max_seconds: float

    def __post_init__(self) -> None:
        if self.max_value_chars < 1 or self.max_steps < 1 or not self.max_seconds >= 0:
            raise ValueError(f"TemplateLimits must be positive, got {self!r}")


class TextSize(NamedTuple):
    """An upper estimate of `len(str(value))` (capped a little past the limit it was asked
    for), the number of values looked at, and the deepest nesting level seen."""

    chars: int
    nodes: int
    depth: int


def text_size(value: object, limit: int) -> TextSize:
    """Estimate the printed size of `value`, walking nested lists, tuples, dicts, sets and
    namespaces (without recursion); stops once the estimate exceeds `limit`, so the cost is
    O(min(size, limit)). Strings inside containers count their quotes; ints their digits."""
    chars = nodes = depth = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    open_namespaces: set[int] = set()  # on the current path: repr prints a cycle as "..."
    while stack and chars <= limit:
        item, level = stack.pop()
        if level < 0:  # leaving a namespace
            open_namespaces.discard(id(item))
            continue
        nodes += 1
        if level > depth:
            depth = level
        kind = type(item)
        if kind is str:
            chars += len(item) + (2 if level else 0)  # type: ignore[arg-type]
        elif kind is dict:
            chars += 2 + 4 * len(item)  # type: ignore[arg-type]
            if chars <= limit:
                for key, val in item.items():  # type: ignore[attr-defined]
                    stack.append((key, level + 1))
                    stack.append((val, level + 1))
        elif kind is list or kind is tuple:
            chars += 2 + 2 * len(item)  # type: ignore[arg-type]
            if chars <= limit:
                stack.extend([(x, level + 1) for x in item])  # type: ignore[attr-defined]
        elif kind is int:
            chars += item.bit_length() // 3 + 2  # type: ignore[attr-defined]
        elif kind is bool or item is None:
            chars += 5
        elif isinstance(item, Mapping):
            chars += 2 + 4 * len(item)
            if chars <= limit:
                stack.extend([(x, level + 1) for pair in item.items() for x in pair])
        elif isinstance(item, _SEQUENCES):
            chars += 2 + 2 * len(item)
            if chars <= limit:
                stack.extend([(x, level + 1) for x in item])
        elif isinstance(item, Namespace):
            if id(item) in open_namespaces:
                chars += 17  # "<Namespace {...}>"
            else:
                chars += 14  # "<Namespace >" around its attributes
                open_namespaces.add(id(item))
                stack.append((item, -1))
                stack.append((item._Namespace__attrs, level + 1))
        else:
            chars += _scalar_chars(item, level)
    return TextSize(chars, nodes, depth)


_SEQUENCES = (list, tuple, set, frozenset, range, KeysView, ValuesView, ItemsView)
_SIZED = (str, bytes, list, tuple)
_RESULTS = (str, bytes, list, tuple, dict, set, frozenset)


def _scalar_chars(item: object, level: int) -> int:
    if isinstance(item, str):  # a str subclass (Markup)
        return len(item) + (2 if level else 0)
    if isinstance(item, bytes | bytearray):
        return 4 * len(item) + 3  # repr: b'\xNN'
    if isinstance(item, bool) or item is None:
        return 5
    if isinstance(item, int):
        return item.bit_length() // 3 + 2
    if isinstance(item, Undefined):
        return 0  # prints as ""
    if isinstance(item, float | complex):
        return 24
    return _OBJECT_CHARS


class RenderBudget:
    """The counters of one render: steps and produced characters left, and the deadline.

    Not shared between renders; every method raises TemplateLimitError when a limit is
    passed, and mutates only this object.
    """

    __slots__ = (
        "_clock",
        "_deadline",
        "_next_clock_check",
        "_produced_left",
        "_steps_left",
        "max_value_chars",
    )

    def __init__(self, limits: TemplateLimits, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_value_chars = limits.max_value_chars
        self._steps_left = limits.max_steps
        self._produced_left = limits.max_value_chars
        self._clock = clock
        self._deadline = clock() + limits.max_seconds
        self._next_clock_check = max(limits.max_steps - _CLOCK_EVERY, 0)

    def spend(self, steps: int) -> None:
        """Charge `steps`; the deadline is checked every `_CLOCK_EVERY` steps."""
        self._steps_left -= steps
        if self._steps_left < self._next_clock_check:
            if self._steps_left < 0:
                raise TemplateLimitError(
                    "chat template ran past its step limit (a loop or recursion too long)"
                )
            if self._clock() >= self._deadline:
                raise TemplateLimitError("chat template ran past its time limit")
            self._next_clock_check = max(self._steps_left - _CLOCK_EVERY, 0)

    def produce(self, num_chars: int) -> None:
        """Charge characters printed into the output or a block's buffer."""
        self._produced_left -= num_chars
        if self._produced_left < 0:
            raise TemplateLimitError(
                f"chat template printed more than {self.max_value_chars} characters"
            )

    def check_size(self, num_chars: int, what: str) -> None:
        """Refuse an operation whose result would hold more than `max_value_chars`."""
        if num_chars > self.max_value_chars:
            raise TemplateLimitError(
                f"{what} would build a value of {num_chars} characters or items; chat templates "
                f"may build at most {self.max_value_chars}"
            )
        if num_chars >= CHARS_PER_STEP:
            self.spend(num_chars // CHARS_PER_STEP)

    def measure(self, value: object) -> TextSize:
        """`text_size` of `value` up to the value limit; the walk is charged as steps."""
        if isinstance(value, str):
            return TextSize(len(value), 1, 0)
        size = text_size(value, self.max_value_chars)
        self.spend(size.nodes // 4)
        return size

    def check_result(self, value: object) -> None:
        """Check the length of a value an operation returned (after the fact: operations
        that could allocate past the limit first were checked before they ran)."""
        if isinstance(value, _RESULTS):
            self.check_size(len(value), "an operation")


# ----------------------------------------------------------------------- operators and formats

_PRINTF_SPEC = re.compile(
    r"%(?:\((?P<key>[^)]*)\))?[-#0 +]*(?P<width>\*|\d+)?(?:\.(?P<precision>\*|\d*))?[hlL]?(?P<conversion>.?)",
    re.DOTALL,
)
_FORMAT_SPEC = re.compile(r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[,_]?(?:\.(?P<precision>\d+))?", re.DOTALL)


def _number(text: str | None, limit: int, what: str) -> int:
    if not text:
        return 0
    if len(text) > 18 or int(text) > limit:
        raise TemplateLimitError(f"{what} {text[:20]} is larger than the chat-template limit {limit}")
    return int(text)


def printf_bound(budget: RenderBudget, fmt: str, args: object) -> int:
    """Upper bound of `len(fmt % args)`; refuses `*` widths and widths past the value limit."""
    limit = budget.max_value_chars
    total = len(fmt)
    position = 0
    for match in _PRINTF_SPEC.finditer(fmt):
        conversion = match["conversion"]
        if conversion == "%":
            continue
        if match["width"] == "*" or match["precision"] == "*":
            raise TemplateLimitError("printf-style '*' widths are not allowed in chat templates")
        width = _number(match["width"], limit, "printf width")
        precision = _number(match["precision"], limit, "printf precision")
        key = match["key"]
        value: object = None
        if key is not None:
            value = args.get(key) if isinstance(args, Mapping) else None
        elif isinstance(args, tuple):
            value = args[position] if position < len(args) else None
            position += 1
        else:
            value = args
        factor = 4 if conversion in ("r", "a") else 1
        total += width + precision + 330 + factor * budget.measure(value).chars  # 330: %f of 1e308
        budget.check_size(total, "a printf-style format")
    return total


def check_format_spec(spec: str, limit: int) -> int:
    """The width plus precision of a `str.format` spec; refuses either past `limit`."""
    match = _FORMAT_SPEC.match(spec)
    if match is None:
        return 0
    return _number(match["width"], limit, "format width") + _number(match["precision"], limit, "format precision")


def check_binop(budget: RenderBudget, operator: str, left: Any, right: Any) -> int:
    """Refuse `left <operator> right` when its result would pass the value or int limit;
    returns an upper bound of the result's length (0 for numbers)."""
    if operator == "+":
        if isinstance(left, _SIZED) and isinstance(right, _SIZED):
            size = len(left) + len(right)
            budget.check_size(size, "'+'")
            return size
    elif operator == "*":
        if isinstance(left, int) and not isinstance(right, int):
            left, right = right, left
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError(f"an integer product past {MAX_INT_BITS} bits")
        elif isinstance(right, int) and isinstance(left, _SIZED):
            count = max(right, 0)
            budget.check_size(len(left) * count, "'*'")
            if isinstance(left, list | tuple) and count:
                budget.check_size(budget.measure(left).chars * count, "'*'")
            return len(left) * count
    elif operator == "%":
        if isinstance(left, str):
            return printf_bound(budget, left, right)
    elif (
        operator == "**"
        and isinstance(left, int)
        and isinstance(right, int)
        and right > 0
        and abs(left) > 1
        and left.bit_length() * right > MAX_INT_BITS
    ):
        raise TemplateLimitError(f"an integer power past {MAX_INT_BITS} bits")
    return 0


def _int_or_zero(value: object) -> int:
    return value if isinstance(value, int) else 0


def _replace_bound(text: str | bytes, old: object, new: object, count: object) -> int:
    if not isinstance(old, str | bytes) or not isinstance(new, str | bytes) or type(old) is not type(text):
        return len(text)
    found = len(text) + 1 if not old else text.count(old)  # type: ignore[arg-type]
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * len(new)


def check_str_method(
    budget: RenderBudget, text: str | bytes, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, ...]:
    """Check a call of str/bytes method `name` that can build more than its inputs hold;
    returns the arguments to call it with (an iterable given to `join` becomes a list)."""
    if name in ("center", "ljust", "rjust", "zfill") and args:
        budget.check_size(max(len(text), _int_or_zero(args[0])), f"str.{name}")
    elif name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        tabs = text.count("\t" if isinstance(text, str) else b"\t")  # type: ignore[arg-type]
        budget.check_size(len(text) + tabs * max(_int_or_zero(tab), 0), "str.expandtabs")
    elif name == "replace" and len(args) >= 2:
        count = args[2] if len(args) > 2 else kwargs.get("count", -1)
        budget.check_size(_replace_bound(text, args[0], args[1], count), "str.replace")
    elif name == "join" and len(args) == 1:
        items = args[0] if isinstance(args[0], list | tuple) else list(args[0])
        budget.check_size(
            sum(len(x) if isinstance(x, str | bytes) else 0 for x in items) + len(items) * len(text),
            "str.join",
        )
        return (items,)
    elif name == "translate" and len(args) == 1:
        table = args[0]
        values = table.values() if isinstance(table, Mapping) else table if isinstance(table, list | tuple) else ()
        longest = max((len(v) for v in values if isinstance(v, str | bytes)), default=1)
        budget.check_size(len(text) * max(longest, 1), "str.translate")
    return args
