"""OpenAI's ``response_format`` body field as batchgen's per-row ``structured_outputs`` struct.

    {"type": "text"}                                        -> None (no constraint)
    {"type": "json_object"}                                 -> {json_object: true}
    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
                                                            -> {json: "<the schema as JSON text>"}

The schema travels as text (one Arrow type for every row's schema); whether the grammar engine
accepts it is decided when the engine compiles it (an error row ``bad_structured_output``).
``strict`` may be true or false: the output always follows the schema. A malformed value raises
ValueError with the message for the row's ``invalid_request`` error.

May import: the standard library and pyarrow. Nothing of batchgen.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

__all__ = ["STRUCTURED_OUTPUTS_TYPE", "structured_outputs_from_response_format"]

STRUCTURED_OUTPUTS_TYPE = pa.struct(
    [
        pa.field("json", pa.string()),
        pa.field("regex", pa.string()),
        pa.field("choice", pa.list_(pa.string())),
        pa.field("grammar", pa.string()),
        pa.field("json_object", pa.bool_()),
    ]
)
_SCHEMA_KEYS = frozenset({"name", "schema", "strict", "description"})


def _struct(**kind: Any) -> dict[str, Any]:
    return {"json": None, "regex": None, "choice": None, "grammar": None, "json_object": None, **kind}


def structured_outputs_from_response_format(value: Any) -> dict[str, Any] | None:
    """The ``structured_outputs`` struct of a request's ``response_format`` (None: text).
    Raises ValueError naming the body field for a malformed value."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
        raise ValueError("body.response_format must be an object with a type (text, json_object or json_schema)")
    kind = value["type"]
    extra = sorted(str(k) for k in value if k not in ("type", "json_schema"))
    if extra or (kind != "json_schema" and "json_schema" in value):
        raise ValueError(f"body.response_format: unexpected field {(extra or ['json_schema'])[0][:80]!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        return _struct(json_object=True)
    if kind != "json_schema":
        raise ValueError(f"body.response_format.type must be text, json_object or json_schema, got {kind[:80]!r}")
    spec = value.get("json_schema")
    if not isinstance(spec, Mapping):
        raise ValueError("body.response_format.json_schema must be an object with a schema")
    unknown = sorted(str(k) for k in spec if k not in _SCHEMA_KEYS)
    if unknown:
        raise ValueError(f"body.response_format.json_schema: unexpected field {unknown[0][:80]!r}")
    name, strict = spec.get("name"), spec.get("strict")
    if name is not None and not isinstance(name, str):
        raise ValueError("body.response_format.json_schema.name must be a string")
    if strict is not None and not isinstance(strict, bool):
        raise ValueError("body.response_format.json_schema.strict must be true or false")
    schema = spec.get("schema")
    if not isinstance(schema, Mapping):
        raise ValueError("body.response_format.json_schema.schema must be a JSON schema (an object)")
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
        raise ValueError(f"body.response_format.json_schema.schema cannot be read: {str(exc)[:200]}") from exc
    return _struct(json=text)
