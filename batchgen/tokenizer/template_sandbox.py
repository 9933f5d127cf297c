"""A jinja2 sandbox whose renders are bounded in size, steps and time (see `template_limits`).

`BoundedSandbox` is jinja2's `ImmutableSandboxedEnvironment` (what transformers renders chat
templates with) plus charges to the render's `RenderBudget`, which the caller passes as the
render variable `BUDGET_KEY` (a name no template can spell):

- the operators `*`, `+`, `%` and `**` (`call_binop`), every call (`call`, with the str
  methods that take a width or a fill checked first), `str.format` / `format_map` (a formatter
  that checks each field's width and the growing result), every printed value (`finalize`),
  and the filters of `template_filters` and `lipsum`;
- `compile_bounded` rewrites the parsed template before compiling it: each `for` body (and its
  `if` filter), macro body and call block starts with a charge of one step plus its literal
  text, and `~` concatenation becomes a checked join. The output is unchanged: the charges
  print "".

Rendering output is byte-for-byte what the plain sandbox renders while no limit is passed.
Imports jinja2, markupsafe (through jinja2) and the template_limits / template_filters modules.
"""

from __future__ import annotations

import functools
import string
import types
from collections.abc import Callable, Mapping
from typing import Any

from jinja2 import nodes, pass_context
from jinja2.runtime import Context, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer
from markupsafe import EscapeFormatter, Markup

from batchgen.tokenizer.template_filters import FILTER_CHECKS, FilterCheck, check_lipsum
from batchgen.tokenizer.template_limits import (
    CHARS_PER_STEP,
    RenderBudget,
    TemplateLimitError,
    check_binop,
    check_format_spec,
    check_str_method,
)

__all__ = ["BUDGET_KEY", "BoundedSandbox", "compile_bounded"]

BUDGET_KEY = "batchgen:budget"  # not an identifier, so no template can read or shadow it
_CHARGE = "batchgen charge"  # filter names the instrumentation uses (no template can spell them)
_CONCAT = "batchgen concat"


def _budget_of(context: Context) -> RenderBudget:
    budget = context.parent.get(BUDGET_KEY)
    if not isinstance(budget, RenderBudget):
        raise RuntimeError(f"a bounded template was rendered without {BUDGET_KEY!r}")
    return budget


@pass_context
def _finalize(context: Context, value: Any) -> Any:
    budget = _budget_of(context)
    size = len(value) if type(value) is str else budget.measure(value).chars
    if size >= CHARS_PER_STEP:
        budget.spend(size // CHARS_PER_STEP)
    budget.produce(size)
    return value


@pass_context
def _charge(context: Context, value: Any, num_chars: int) -> Any:
    """One step of a loop, macro or call block, which prints up to `num_chars` literal chars."""
    budget = _budget_of(context)
    budget.spend(1 + num_chars // CHARS_PER_STEP)
    budget.produce(num_chars)
    return value


@pass_context
def _concat(context: Context, items: list[Any]) -> str:
    """`a ~ b ~ c`, as jinja compiles it (str_join, or markup_join under autoescape)."""
    budget = _budget_of(context)
    budget.check_size(sum(budget.measure(item).chars for item in items), "'~'")
    join = markup_join if context.eval_ctx.autoescape else str_join
    return str(join(items))


def _guard_filter(original: Callable[..., Any], check: FilterCheck) -> Callable[..., Any]:
    """`original`, checked by `check` first; passes the context, eval context or environment
    to `original` as jinja would."""
    pass_arg = getattr(original, "jinja_pass_arg", None)

    @functools.wraps(original)
    def guarded(context: Context, value: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget_of(context)
        budget.spend(1)
        value = check(budget, value, *args, **kwargs)
        if pass_arg is _PassArg.context:
            result = original(context, value, *args, **kwargs)
        elif pass_arg is _PassArg.eval_context:
            result = original(context.eval_ctx, value, *args, **kwargs)
        elif pass_arg is _PassArg.environment:
            result = original(context.environment, value, *args, **kwargs)
        else:
            result = original(value, *args, **kwargs)
        budget.check_result(result)
        return result

    guarded.jinja_pass_arg = _PassArg.context  # type: ignore[attr-defined]
    return guarded


class _BoundedFormatter(SandboxedFormatter):
    """The sandbox's `str.format` formatter, checking each field and the running total."""

    def __init__(self, env: BoundedSandbox, budget: RenderBudget | None, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self._budget = budget
        self._limit = env.unbudgeted_value_chars if budget is None else budget.max_value_chars
        self._total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        pad = check_format_spec(format_spec, self._limit)
        if self._budget is not None:
            self._budget.spend(1)
            size = self._budget.measure(value).chars
            self._budget.check_size(self._total + pad + size, "str.format")
        result = super().format_field(value, format_spec)
        self._total += len(result)
        if self._total > self._limit:
            raise TemplateLimitError(f"str.format built more than {self._limit} characters")
        return result


class _BoundedEscapeFormatter(_BoundedFormatter, EscapeFormatter):
    pass


class _FormatMethod:
    """`text.format` / `text.format_map`, as the sandbox exposes them, with a bounded formatter."""

    __slots__ = ("_env", "_is_format_map", "_text")

    def __init__(self, env: BoundedSandbox, text: str, is_format_map: bool) -> None:
        self._env = env
        self._text = text
        self._is_format_map = is_format_map

    def __call__(self, *args: Any, **kwargs: Any) -> str:
        return self.apply(None, args, kwargs)

    def apply(self, budget: RenderBudget | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self._is_format_map:
            if kwargs:
                raise TypeError("format_map() takes no keyword arguments")
            if len(args) != 1:
                raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
            kwargs, args = args[0], ()
        formatter: string.Formatter
        if isinstance(self._text, Markup):
            formatter = _BoundedEscapeFormatter(self._env, budget, escape=self._text.escape)
        else:
            formatter = _BoundedFormatter(self._env, budget)
        return type(self._text)(formatter.vformat(self._text, args, kwargs))


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with the charges of the module docstring.

    `filters` and `globals_` are added to jinja's defaults before the size-checked filters
    are wrapped (`lipsum` is checked in `call`). `unbudgeted_value_chars` bounds `str.format` called outside
    `call` (which has no budget at hand).
    """

    intercepted_binops = frozenset({"*", "+", "%", "**"})

    def __init__(
        self,
        *,
        filters: Mapping[str, Callable[..., Any]],
        globals_: Mapping[str, Any],
        unbudgeted_value_chars: int,
        **options: Any,
    ) -> None:
        super().__init__(finalize=_finalize, **options)
        self.unbudgeted_value_chars = unbudgeted_value_chars
        self.filters.update(filters)
        self.globals.update(globals_)
        for name, check in FILTER_CHECKS.items():
            self.filters[name] = _guard_filter(self.filters[name], check)
        self.filters[_CHARGE] = _charge
        self.filters[_CONCAT] = _concat

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        # Not a step of its own: repeating it takes a loop or macro, which are charged.
        budget = _budget_of(context)
        if operator == "+" and type(left) is str and type(right) is str:
            budget.check_size(len(left) + len(right), "'+'")
            return left + right
        if check_binop(budget, operator, left, right):
            return self.binop_table[operator](left, right)  # its size was checked before
        result = self.binop_table[operator](left, right)
        budget.check_result(result)
        return result

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget_of(context)
        budget.spend(1)
        if isinstance(obj, _FormatMethod):
            result: Any = obj.apply(budget, args, kwargs)
        else:
            if isinstance(obj, types.BuiltinMethodType) and isinstance(obj.__self__, str | bytes):
                args = check_str_method(budget, obj.__self__, obj.__name__, args, kwargs)
            elif obj is self.globals.get("lipsum"):
                check_lipsum(budget, *args, **kwargs)
            result = super().call(context, obj, *args, **kwargs)
        budget.check_result(result)
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        if not isinstance(value, types.MethodType | types.BuiltinMethodType) or value.__name__ not in (
            "format",
            "format_map",
        ):
            return None
        if not isinstance(value.__self__, str):
            return None
        return _FormatMethod(self, value.__self__, value.__name__ == "format_map")


def _literal_chars(body: list[nodes.Node]) -> int:
    return sum(len(data.data) for node in body for data in node.find_all(nodes.TemplateData))


def _charge_node(node: nodes.Expr, num_chars: int) -> nodes.Filter:
    return nodes.Filter(node, _CHARGE, [nodes.Const(num_chars)], [], None, None)


class _Instrument(NodeTransformer):
    """Adds the charges of the module docstring to a parsed template."""

    def _charge_body(self, node: nodes.For | nodes.Macro | nodes.CallBlock) -> None:
        charge = nodes.Output([_charge_node(nodes.Const(""), _literal_chars(node.body))])
        node.body.insert(0, charge.set_lineno(node.lineno))

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        self._charge_body(node)
        if node.test is not None:
            node.test = nodes.And(_charge_node(nodes.Const(True), 0), node.test).set_lineno(node.lineno)
        return node

    def visit_Macro(self, node: nodes.Macro) -> nodes.Node:
        self.generic_visit(node)
        self._charge_body(node)
        return node

    def visit_CallBlock(self, node: nodes.CallBlock) -> nodes.Node:
        self.generic_visit(node)
        self._charge_body(node)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Filter(nodes.List(node.nodes), _CONCAT, [], [], None, None).set_lineno(node.lineno)


def compile_bounded(env: BoundedSandbox, source: str) -> Any:
    """Parse `source`, add the charges and compile it into a `jinja2.Template`.
    Raises what jinja2 raises for a template that does not parse."""
    tree = env.parse(source)
    instrumented = _Instrument().visit(tree)
    assert isinstance(instrumented, nodes.Template)
    instrumented.set_environment(env)
    return env.from_string(instrumented)
