"""`StructuredOutputsParams`: what a request's output must match, with vLLM's field names.

Exactly one kind per request: `json` (a JSON schema, as a mapping or as its JSON text),
`regex` (the whole output matches it), `choice` (the output is one of these strings),
`grammar` (a Lark grammar, llguidance's form; a GBNF grammar with `::=` rules is converted) or
`json_object` (True: any JSON object). Immutable; `__post_init__` checks types and sizes and
raises ValueError naming the field. Whether the grammar engine accepts the schema, regex or
grammar is known only when it is compiled (`batchgen.engine.structured.grammar`).

`canonical_text` is the compile cache's key: equal for the same constraint however it was
spaced or escaped, as a dict or as its JSON text. A schema's key order is kept, in the key and
in what the grammar engine sees: the order of `properties` is the order the output writes them.

Pure Python: no torch, no grammar library. May import: batchgen._checks.
"""

from __future__ import annotations

import json as _json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

__all__ = [
    "MAX_CHOICES",
    "MAX_STRUCTURED_CHARS",
    "StructuredKind",
    "StructuredOutputsParams",
]

StructuredKind = Literal["json", "regex", "choice", "grammar", "json_object"]

# A schema, regex or grammar is compiled once per distinct text, but every row carrying one is
# parsed and hashed: 1 MiB of text per row bounds that work and a row's memory.
MAX_STRUCTURED_CHARS = 1 << 20
MAX_CHOICES = 4096
_KINDS: tuple[StructuredKind, ...] = ("json", "regex", "choice", "grammar", "json_object")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    """One constraint on a request's output; exactly one field set (json_object only when True).

    json: a JSON schema, a mapping or its JSON text (an object); regex: a pattern the whole
    output matches (Rust `regex` syntax: no look-around, no backreferences); choice: non-empty
    strings, the output is exactly one of them; grammar: a Lark grammar (llguidance's syntax,
    `start` the start rule) or GBNF (`root ::= ...`); json_object: True for any JSON object.
    """

    json: Mapping[str, Any] | str | None = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        set_kinds = [k for k in _KINDS if self._is_set(k)]
        if len(set_kinds) != 1:
            found = ", ".join(set_kinds) if set_kinds else "none"
            raise ValueError(
                "StructuredOutputsParams must set exactly one of json, regex, choice, grammar, "
                f"json_object (True); got {found}"
            )
        if self.json_object is not None and not isinstance(self.json_object, bool):
            raise ValueError(f"StructuredOutputsParams.json_object must be a boolean, got {_short(self.json_object)}")
        kind = set_kinds[0]
        if kind == "json":
            self._check_json()
        elif kind in ("regex", "grammar"):
            text = getattr(self, kind)
            if not isinstance(text, str) or not text.strip() or len(text) > MAX_STRUCTURED_CHARS:
                raise ValueError(
                    f"StructuredOutputsParams.{kind} must be a non-blank string of at most "
                    f"{MAX_STRUCTURED_CHARS} characters, got {_short(text)}"
                )
        elif kind == "choice":
            self._check_choice()

    def _is_set(self, kind: StructuredKind) -> bool:
        value = getattr(self, kind)
        return value is True if kind == "json_object" else value is not None

    def _check_json(self) -> None:
        schema = self.json
        if isinstance(schema, str):
            if len(schema) > MAX_STRUCTURED_CHARS:
                raise ValueError(
                    f"StructuredOutputsParams.json: the schema text is {len(schema)} characters; "
                    f"at most {MAX_STRUCTURED_CHARS}"
                )
            _canonical_json(_schema_object(schema))  # NaN and Infinity parse but are not JSON
            return
        if not isinstance(schema, Mapping):
            raise ValueError(
                f"StructuredOutputsParams.json must be a JSON schema (a mapping or its JSON text), got {_short(schema)}"
            )
        if len(_canonical_json(schema)) > MAX_STRUCTURED_CHARS:
            raise ValueError(f"StructuredOutputsParams.json: the schema is over {MAX_STRUCTURED_CHARS} characters")

    def _check_choice(self) -> None:
        choice = self.choice
        if isinstance(choice, str) or not isinstance(choice, Sequence) or not 1 <= len(choice) <= MAX_CHOICES:
            raise ValueError(
                f"StructuredOutputsParams.choice must be a list of 1 to {MAX_CHOICES} strings, got {_short(choice)}"
            )
        if not all(isinstance(c, str) and c for c in choice):
            raise ValueError(f"StructuredOutputsParams.choice must hold non-empty strings, got {_short(choice)}")
        if sum(len(c) for c in choice) > MAX_STRUCTURED_CHARS:
            raise ValueError(f"StructuredOutputsParams.choice: over {MAX_STRUCTURED_CHARS} characters in all")

    # ------------------------------------------------------------- views
    @property
    def kind(self) -> StructuredKind:
        return next(k for k in _KINDS if self._is_set(k))

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON schema as a dict (parsed when given as text); None for other kinds."""
        if self.json is None:
            return None
        if isinstance(self.json, str):
            return _schema_object(self.json)
        parsed: dict[str, Any] = _json.loads(_canonical_json(self.json))
        return parsed

    @property
    def canonical_text(self) -> str:
        """`kind` then the constraint in one normal form (the compile cache's key): a schema as
        compact JSON in its own key order, choices as a JSON list, a regex or grammar as written."""
        kind = self.kind
        if kind == "json":
            body = _canonical_json(self.schema or {})
        elif kind == "choice":
            body = _json.dumps(list(self.choice or ()), ensure_ascii=False)
        elif kind == "json_object":
            body = ""
        else:
            body = str(getattr(self, kind))
        return f"{kind}:{body}"

    def to_dict(self) -> dict[str, Any]:
        """The one set field as plain JSON values ({kind: value}); a schema as a dict."""
        kind = self.kind
        if kind == "json":
            return {"json": self.schema}
        if kind == "choice":
            return {"choice": list(self.choice or ())}
        return {kind: getattr(self, kind)}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> StructuredOutputsParams:
        """Build from a dict (a job file, a per-row struct whose unset fields are null, an
        OpenAI body); None values count as unset; unknown keys raise ValueError."""
        if not isinstance(values, Mapping):
            raise ValueError(
                f"structured_outputs must be a mapping with one of {', '.join(_KINDS)}, got {_short(values)}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in values if k not in known)
        if unknown:
            raise ValueError(
                f"unknown structured_outputs key(s) {', '.join(unknown)}; expected one of {', '.join(_KINDS)}"
            )
        given = {k: v for k, v in values.items() if v is not None}
        if "choice" in given and isinstance(given["choice"], list):
            given["choice"] = tuple(given["choice"])
        return cls(**given)

    @classmethod
    def coerce(cls, value: StructuredOutputsParams | Mapping[str, Any] | None) -> StructuredOutputsParams | None:
        """`value` as a StructuredOutputsParams (a mapping goes through `from_mapping`)."""
        if value is None or isinstance(value, StructuredOutputsParams):
            return value
        return cls.from_mapping(value)


def _canonical_json(value: Any) -> str:
    """Compact JSON text in the value's key order; ValueError for values JSON cannot hold."""
    try:
        return _json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"StructuredOutputsParams.json is not a JSON value: {exc}") from exc


def _schema_object(text: str) -> dict[str, Any]:
    """A schema's JSON text parsed; ValueError unless it is valid JSON holding an object."""
    try:
        parsed = _json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise ValueError(
            f"StructuredOutputsParams.json must be a JSON object (a schema), got {type(parsed).__name__}"
        )
    return parsed
