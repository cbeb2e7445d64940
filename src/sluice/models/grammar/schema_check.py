"""Which JSON-schema features constrained decoding enforces, checked before a request is queued.

The grammar library (llguidance) refuses most keywords it cannot enforce, but by their bare
name and without a location. This walk runs first so that the error names the keyword and
where it sits (`properties.tags.uniqueItems`), and it also refuses three things the library
would accept while enforcing something else than JSON Schema 2020-12 means:

- `oneOf`: the library can only treat it as `anyOf`, which lets through an instance that
  matches two branches (use `anyOf`);
- `items` as an array / `additionalItems` (the draft-7 tuple form; use `prefixItems`);
- boolean `exclusiveMinimum` / `exclusiveMaximum` (draft-4; give the bound as a number).

Keywords nobody can enforce during generation are listed in UNSUPPORTED (docs/ENGINE.md has the
table). Unknown keywords and annotations (title, description, examples, default, $comment, …)
are ignored, as JSON Schema itself ignores them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sluice.errors import InvalidRequestError

UNSUPPORTED: dict[str, str] = {
    "oneOf": "use anyOf",
    "not": "",
    "if": "",
    "then": "",
    "else": "",
    "uniqueItems": "",
    "contains": "",
    "minContains": "",
    "maxContains": "",
    "propertyNames": "",
    "dependentRequired": "",
    "dependentSchemas": "",
    "dependencies": "",
    "unevaluatedProperties": "use additionalProperties",
    "unevaluatedItems": "use items",
    "additionalItems": "use prefixItems and items",
    "$dynamicRef": "",
    "$dynamicAnchor": "",
    "$recursiveRef": "",
    "$recursiveAnchor": "",
}

# Where subschemas sit: one schema, a list of schemas, or a name → schema map.
_ONE = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_LIST = ("anyOf", "allOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def _children(schema: dict[str, Any], path: str) -> Iterator[tuple[Any, str]]:
    for key in _ONE:
        if key in schema and not (key == "items" and isinstance(schema[key], list)):
            yield schema[key], f"{path}.{key}"
    for key in _LIST:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield sub, f"{path}.{key}.{i}"
    for key in _MAP:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                yield sub, f"{path}.{key}.{name}"


def check_schema(schema: Any, where: str) -> None:
    """Raise InvalidRequestError naming the first keyword the decoder cannot enforce.

    `where` prefixes the path in the message (e.g. "tools.0.input_schema")."""
    stack = [(schema, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, bool):
            continue  # true / false are valid schemas
        if not isinstance(node, dict):
            raise InvalidRequestError(
                f"{path}: a JSON schema must be an object or a boolean, got {type(node).__name__}"
            )
        for key, hint in UNSUPPORTED.items():
            if key in node:
                extra = f" ({hint})" if hint else ""
                raise InvalidRequestError(
                    f"{path}.{key}: the JSON schema keyword '{key}' is not supported for constrained decoding{extra}"
                )
        if isinstance(node.get("items"), list):
            raise InvalidRequestError(
                f"{path}.items: 'items' as an array (draft-7 tuples) is not supported; use prefixItems"
            )
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(node.get(key), bool):
                raise InvalidRequestError(
                    f"{path}.{key}: must be a number (the JSON Schema 2020-12 form), not a boolean"
                )
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            raise InvalidRequestError(f"{path}.$ref: only local references ('#/$defs/…') are supported, got {ref!r}")
        stack.extend(_children(node, path))
