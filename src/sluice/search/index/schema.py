"""Which fields a document has, which are indexed and stored, which a query searches by default.

The default schema needs no declaration: every string field is indexed (under its own prefix,
so `title:word` searches one field) and stored (returned with the hit); `title` and `body` are
also indexed without a prefix, which is what a bare query word searches. A config may name
other default fields, restrict indexing to a list, or store only some fields.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import re
from typing import Any

from sluice.search.errors import DocumentError

FIELD_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_ID_BYTES = 200  # Xapian terms are at most 245 bytes; the id term is "Q" + id
MAX_DOCUMENT_BYTES = 1 << 20


class RangeKind(str, enum.Enum):
    """The kinds of field a range filter (gte / lte) may name: declared in search.toml."""

    NUMBER = "number"
    DATE = "date"  # ISO 8601 dates or times, compared as POSIX seconds


def range_value(kind: RangeKind, value: Any) -> float:
    """A range field's value as the number it is compared by (a date: its POSIX seconds, UTC
    when it names no offset); ValueError naming what is wrong."""
    if kind is RangeKind.DATE:
        if not isinstance(value, str):
            raise ValueError("a date is an ISO 8601 string")
        try:
            when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{value[:40]!r} is not an ISO 8601 date") from None
        return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("a number is required")
    return float(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Schema:
    default_fields: tuple[str, ...] = ("title", "body")
    indexed: tuple[str, ...] | None = None  # None: every string field
    stored: tuple[str, ...] | None = None  # None: every field
    snippet: tuple[str, ...] | None = None  # the fields a hit's snippet is taken from (None: see snippet_fields)
    ranges: dict[str, RangeKind] = dataclasses.field(default_factory=dict)  # range-filterable fields (filters.py)

    @property
    def snippet_fields(self) -> tuple[str, ...]:
        """The fields a snippet shows: as configured, else the default fields but `title`
        (a hit's title is shown on its own), else the default fields."""
        if self.snippet is not None:
            return self.snippet
        return tuple(f for f in self.default_fields if f != "title") or self.default_fields

    def is_indexed(self, name: str) -> bool:
        return self.indexed is None or name in self.indexed

    def is_stored(self, name: str) -> bool:
        return self.stored is None or name in self.stored

    def check_ranges(self, fields: dict[str, Any]) -> None:
        """DocumentError when a declared range field holds what it cannot compare."""
        for name, kind in self.ranges.items():
            if name in fields:
                try:
                    range_value(kind, fields[name])
                except ValueError as exc:
                    raise DocumentError(f"field {name!r} is a {kind.value} range field: {exc}") from None

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ranges": {k: v.value for k, v in self.ranges.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Schema:
        def tup(v: Any) -> tuple[str, ...] | None:
            return None if v is None else tuple(v)

        return cls(
            default_fields=tuple(data.get("default_fields", ("title", "body"))),
            indexed=tup(data.get("indexed")),
            stored=tup(data.get("stored")),
            snippet=tup(data.get("snippet")),
            ranges={k: RangeKind(v) for k, v in (data.get("ranges") or {}).items()},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class SourceDocument:
    """A validated input document: its id and its fields (JSON values, strings indexed)."""

    doc_id: str
    fields: dict[str, Any]


def parse_document(obj: Any) -> SourceDocument:
    """A bulk line's JSON object → SourceDocument, or DocumentError naming what is wrong."""
    if not isinstance(obj, dict):
        raise DocumentError(f"a document is a JSON object, got {type(obj).__name__}")
    if "id" not in obj:
        raise DocumentError('a document needs an "id"')
    doc_id = obj["id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)):
        raise DocumentError('"id" must be a string or an integer')
    doc_id = str(doc_id)
    check_id(doc_id)
    fields = {k: v for k, v in obj.items() if k != "id"}
    for name in fields:
        if not FIELD_NAME.match(name):
            raise DocumentError(f"field name {name[:80]!r} must match {FIELD_NAME.pattern}")
    return SourceDocument(doc_id, fields)


def check_id(doc_id: str) -> None:
    if not doc_id or len(doc_id.encode()) > MAX_ID_BYTES:
        raise DocumentError(f'"id" must be 1 to {MAX_ID_BYTES} bytes')
    if any(c in doc_id for c in "\x00\n\r"):
        raise DocumentError('"id" must not contain NUL or line breaks')
