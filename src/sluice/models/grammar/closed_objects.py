"""Generate only the properties a schema lists: `additionalProperties: false` where it is silent.

JSON Schema lets an object carry any property it does not mention, and a grammar that allows
that lets a small model wander into invented keys until max_tokens (seen with the bundled
model: `"timezone": "…", "type": "string", "description": …`). Closing such objects only
narrows the set of outputs, so every output still validates against the caller's schema.

Left alone: objects that say anything about extra properties (`additionalProperties`,
`patternProperties`), objects whose `required` names a property they do not list (closing them
would make the schema unsatisfiable), and everything under `allOf` (its branches describe one
object together; closing each would forbid the others' properties).
"""

from __future__ import annotations

from typing import Any

_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")


def close_objects(schema: Any) -> Any:
    """A copy of `schema` with silent objects closed (see the module docstring)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    props = out.get("properties")
    if (
        isinstance(props, dict)
        and "additionalProperties" not in out
        and "patternProperties" not in out
        and all(name in props for name in out.get("required", []) if isinstance(name, str))
    ):
        out["additionalProperties"] = False
    for key in _ONE:
        if isinstance(out.get(key), dict):
            out[key] = close_objects(out[key])
    for key in _LIST:
        if isinstance(out.get(key), list):
            out[key] = [close_objects(s) for s in out[key]]
    for key in _MAP:
        if isinstance(out.get(key), dict):
            out[key] = {name: close_objects(s) for name, s in out[key].items()}
    return out
