"""JSON scalars as the wire schemas take them (strict: no "4" for 4, no "yes" for true).

`JsonInt`: an integer field takes a JSON integer, and also an integral number written with a
fraction (`60.0`). JSON Schema — and so the OpenAPI document, and every schema-driven client —
calls 60.0 an integer (JSON has one number type), and a strict int would refuse it; `60.5`,
strings and booleans stay refused.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from sluice.types import INT32_MAX, INT64_MAX, INT64_MIN


def _integral(value: Any) -> Any:
    if type(value) is float and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral)]

# Ranged integers, the range inside the type: on an optional field (`X | None`) pydantic can
# then state it in the JSON schema (minimum / maximum); a range given on the field itself
# would still be checked, but be written as invalid `ge` / `le` keywords in the document.
Count = Annotated[int, Field(ge=0, le=INT32_MAX), BeforeValidator(_integral)]  # what the worker protocol carries
PositiveCount = Annotated[int, Field(ge=1, le=INT32_MAX), BeforeValidator(_integral)]
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX), BeforeValidator(_integral)]
LogprobCount = Annotated[int, Field(ge=0, le=20), BeforeValidator(_integral)]  # alternatives per token (OpenAI's limit)
ChoiceCount = Annotated[int, Field(ge=1, le=16), BeforeValidator(_integral)]  # n / best_of
