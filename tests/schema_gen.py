"""Random JSON schemas for the constrained-decoding property test: objects, arrays, enums,
bounded numbers, nested objects, required and optional properties, anyOf, $ref, nullable.

Every schema's instances are bounded in size (strings have maxLength, arrays maxItems, numbers
are bounded integers or bounded multiples of 0.5 / 0.25), so a valid reply always fits the
test's max_tokens.
"""

from __future__ import annotations

import random
from typing import Any

WORDS = [
    "name",
    "city",
    "age",
    "score",
    "tags",
    "kind",
    "items",
    "count",
    "level",
    "color",
    "owner",
    "price",
    "size",
    "notes",
    "id",
]


def _leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["string", "integer", "number", "boolean", "enum", "const", "nullable", "pattern", "format"])
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(3, 12)}
    if kind == "integer":
        lo = rng.randint(-100, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + rng.randint(0, 200)}
    if kind == "number":
        # multipleOf bounds the fraction digits: without it a sampled number may never end
        low = rng.choice([0, -1, 0.5, 10])
        out: dict[str, Any] = {"type": "number", "minimum": low, "maximum": low + rng.choice([1, 5, 100])}
        if rng.random() < 0.3:
            out = {"type": "number", "exclusiveMinimum": low, "exclusiveMaximum": low + 10}
        out["multipleOf"] = rng.choice([0.5, 0.25])
        return out
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2, None, True, "x y"], rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(["fixed", 7, False])}
    if kind == "nullable":
        return {"type": ["integer", "null"], "minimum": 0, "maximum": 9}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice(["^[a-z]{2,5}$", "^[A-Z][0-9]{3}$", "^(yes|no)$"])}
    # formats get a maxLength too: an email or a time's fraction could otherwise grow forever
    return {"type": "string", "format": rng.choice(["date", "time", "uuid", "email"]), "maxLength": 40}


def _node(rng: random.Random, depth: int) -> dict[str, Any]:
    r = rng.random()
    if depth <= 0 or r < 0.45:
        return _leaf(rng)
    if r < 0.7:
        return _object(rng, depth - 1)
    if r < 0.9:
        return {
            "type": "array",
            "items": _node(rng, depth - 1),
            "minItems": rng.randint(0, 1),
            "maxItems": rng.randint(1, 3),
        }
    return {"anyOf": [_leaf(rng), _leaf(rng)]}


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(WORDS, rng.randint(1, 4))
    props = {n: _node(rng, depth) for n in names}
    required = [n for n in names if rng.random() < 0.6]
    out: dict[str, Any] = {"type": "object", "properties": props, "required": required}
    if rng.random() < 0.5:
        out["additionalProperties"] = False
    return out


def random_schema(seed: int) -> dict[str, Any]:
    """A top-level object schema (a structured-output reply); some use $defs and $ref."""
    rng = random.Random(seed)
    schema = _object(rng, depth=2)
    if rng.random() < 0.25:
        schema["$defs"] = {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 99},
                    "y": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["x", "y"],
            }
        }
        schema["properties"]["where"] = {"$ref": "#/$defs/point"}
        schema["required"].append("where")
    return schema
