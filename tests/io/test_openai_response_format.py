"""OpenAI's response_format as the per-row structured_outputs struct."""

from __future__ import annotations

import json

import pytest

from batchgen.io.openai_response_format import structured_outputs_from_response_format as convert

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}


def test_kinds() -> None:
    assert convert(None) is None and convert({"type": "text"}) is None
    assert convert({"type": "json_object"}) == {"json": None, "regex": None, "choice": None, "grammar": None, "json_object": True}
    out = convert({"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": False, "description": "d"}})
    assert out is not None and json.loads(out["json"]) == SCHEMA and list(json.loads(out["json"])["properties"]) == ["b", "a"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("json", "must be an object with a type"),
        ({"type": "xml"}, "type must be text, json_object or json_schema"),
        ({"type": "json_schema"}, "json_schema must be an object"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema must be a JSON schema"),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": "yes"}}, "strict must be true or false"),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "name": 3}}, "name must be a string"),
        ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "extra": 1}}, "unexpected field 'extra'"),
        ({"type": "json_object", "json_schema": {}}, "unexpected field 'json_schema'"),
        ({"type": "text", "x": 1}, "unexpected field 'x'"),
        ({"type": "json_schema", "json_schema": {"schema": {"x": float("nan")}}}, "cannot be read"),
    ],
)
def test_malformed(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        convert(value)
