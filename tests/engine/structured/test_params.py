"""StructuredOutputsParams: exactly one kind, vLLM's names, dicts accepted, canonical text."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchgen.engine.structured.params import (
    MAX_CHOICES,
    MAX_STRUCTURED_CHARS,
    StructuredOutputsParams,
)

SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}, "required": ["a"]}


@pytest.mark.parametrize(
    ("values", "kind"),
    [
        ({"json": SCHEMA}, "json"),
        ({"json": json.dumps(SCHEMA)}, "json"),
        ({"regex": r"\d+"}, "regex"),
        ({"choice": ["a", "b"]}, "choice"),
        ({"grammar": 'start: "x"'}, "grammar"),
        ({"json_object": True}, "json_object"),
        # a per-row struct: every field present, the unused ones null (json_object false)
        ({"json": None, "regex": "a+", "choice": None, "grammar": None, "json_object": False}, "regex"),
    ],
)
def test_one_kind(values: dict[str, object], kind: str) -> None:
    params = StructuredOutputsParams.from_mapping(values)
    assert params.kind == kind
    assert StructuredOutputsParams.coerce(values) == params
    assert StructuredOutputsParams.coerce(params) is params


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"json_object": False},
        {"regex": "a", "choice": ["a"]},
        {"json": SCHEMA, "json_object": True},
        {"grammar": 'start: "x"', "regex": "x"},
    ],
)
def test_not_exactly_one_kind(values: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="exactly one of json, regex, choice, grammar, json_object"):
        StructuredOutputsParams.from_mapping(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"jsonschema": SCHEMA}, "unknown structured_outputs key"),
        ({"json": "{not json"}, "json is not valid JSON"),
        ({"json": "[1, 2]"}, "must be a JSON object"),
        ({"json": '{"minimum": NaN}'}, "not a JSON value"),
        ({"json": {"x": {1, 2}}}, "not a JSON value"),
        ({"json": 3}, "must be a JSON schema"),
        ({"regex": ""}, "non-blank string"),
        ({"regex": 5}, "non-blank string"),
        ({"grammar": "   "}, "non-blank string"),
        ({"choice": "ab"}, "list of 1 to"),
        ({"choice": []}, "list of 1 to"),
        ({"choice": ["a", ""]}, "non-empty strings"),
        ({"choice": ["a", 1]}, "non-empty strings"),
        ({"json_object": "yes"}, "exactly one"),
        ({"choice": ["x"] * (MAX_CHOICES + 1)}, "list of 1 to"),
        ({"regex": "a" * (MAX_STRUCTURED_CHARS + 1)}, "at most"),
        ({"json": json.dumps({"description": "a" * MAX_STRUCTURED_CHARS})}, "at most"),
    ],
)
def test_bad_values_name_the_field(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams.from_mapping(values)


def test_json_object_must_be_a_boolean() -> None:
    with pytest.raises(ValueError, match="json_object must be a boolean"):
        StructuredOutputsParams(regex="a", json_object=0)  # type: ignore[arg-type]


def test_not_a_mapping() -> None:
    with pytest.raises(ValueError, match="must be a mapping"):
        StructuredOutputsParams.from_mapping(["json"])  # type: ignore[arg-type]


def test_canonical_text_and_to_dict() -> None:
    as_dict = StructuredOutputsParams(json=SCHEMA)
    as_text = StructuredOutputsParams(json=json.dumps(SCHEMA, indent=3))
    assert as_dict.canonical_text == as_text.canonical_text == "json:" + json.dumps(SCHEMA, separators=(",", ":"))
    assert as_text.to_dict() == {"json": SCHEMA}
    assert StructuredOutputsParams(choice=("a", "b")).to_dict() == {"choice": ["a", "b"]}
    assert StructuredOutputsParams(choice=["a", "b"]).canonical_text == 'choice:["a", "b"]'
    assert StructuredOutputsParams(json_object=True).canonical_text == "json_object:"
    assert StructuredOutputsParams(regex="a|b").canonical_text == "regex:a|b"
    # kinds never share a key
    assert StructuredOutputsParams(regex="x").canonical_text != StructuredOutputsParams(grammar="x").canonical_text


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150)
@given(st.dictionaries(st.text(max_size=6), _json_values, max_size=5), st.integers(0, 2**32 - 1))
def test_canonical_text_ignores_spacing_and_escapes_but_keeps_key_order(schema: dict[str, object], seed: int) -> None:
    """The class: however a schema is written (dict or text, indentation, ASCII escapes), the
    cache key is the same; another key order (the order `properties` are written in) or another
    value gives another key."""
    rng = random.Random(seed)
    text = json.dumps(schema, indent=rng.choice([None, 0, 2]), ensure_ascii=rng.random() < 0.5)
    a, b = StructuredOutputsParams(json=schema), StructuredOutputsParams(json=text)
    assert a.canonical_text == b.canonical_text
    assert b.schema == schema and list(b.schema) == list(schema)
    other = StructuredOutputsParams(json={**schema, "\x00extra": 1})
    assert other.canonical_text != a.canonical_text
    if len(schema) > 1:
        reordered = dict(reversed(list(schema.items())))
        assert StructuredOutputsParams(json=reordered).canonical_text != a.canonical_text
