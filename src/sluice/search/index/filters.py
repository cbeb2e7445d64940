"""Filters: which documents a search may return, never how they score.

A request's `"filter"` is one object whose keys are fields, all of which must hold:

    {"FIELD": VALUE}                      the field equals VALUE (a string, number or boolean;
                                          a list field holds it)
    {"FIELD": {"in": [V, ...]}}           equals one of them
    {"FIELD": {"not_in": [V, ...]}}       equals none of them (a document without the field passes)
    {"FIELD": {"gte": X, "lte": Y}}       within the bounds (either may be left out), on a field
                                          declared in search.toml's `range_fields` as "number"
                                          (X, Y numbers) or "date" (ISO 8601 dates or times)
    {"url.domain": ...}                   the host of the document's `url` field, or a domain
                                          above it: "example.com" matches docs.example.com too

How: every scalar value of a stored field (and each element of a list of them) is indexed as
a boolean term `K<FIELD>:<type><value>` (no weight, no positions), every declared range field's
value as a sortable number in a value slot of its own, and a `url` field's host and the
domains above it as terms of `url.domain`. A filter is a Xapian query of those terms and value
ranges joined to the search's query with OP_FILTER (AND_NOT for `not_in`), which keeps the
search's weights: a filtered answer is the unfiltered answer less the documents it excludes,
on one index as across shards (the statistics are still every document's).

On the wire to a shard a filter is a list of clauses, already canonical: `["in", field,
[term values]]`, `["not_in", field, [term values]]`, `["range", field, low, high]` (numbers or
null; a date is its POSIX seconds).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import zlib
from typing import Any
from urllib.parse import urlsplit

import xapian

from sluice.search.index.schema import FIELD_NAME, RangeKind, range_value

DOMAIN_FIELD = "url.domain"  # not a field name a document can have (FIELD_NAME has no dot)
URL_FIELD = "url"
MAX_CLAUSES = 32
MAX_VALUES = 256  # values in one in / not_in
MAX_PLAIN_VALUE_BYTES = 160  # longer values are indexed by their SHA-1 (Xapian terms are ≤ 245 bytes)
RANGE_SLOT_BASE = 1 << 16  # a range field's value slot: this + 24 bits of crc32(name), stable under reordering


class FilterOp(str, enum.Enum):
    IN = "in"  # also what a bare value means
    NOT_IN = "not_in"
    GTE = "gte"
    LTE = "lte"


class FilterError(ValueError):
    """A filter the service cannot apply; the message names the field and what is wrong."""


Clause = list[Any]  # ["in" | "not_in", field, [values]] | ["range", field, low, high]


def range_slot(name: str) -> int:
    return RANGE_SLOT_BASE + (zlib.crc32(name.encode()) & 0xFFFFFF)


def filter_prefix(field: str) -> str:
    return "K" + field.upper() + ":"


def term_value(value: Any) -> str | None:
    """A scalar's indexed spelling (its type first, so "3" and 3 differ); None: not filterable."""
    if isinstance(value, bool):
        text = "b" + ("true" if value else "false")
    elif isinstance(value, int):
        text = "n" + str(value)
    elif isinstance(value, float):
        if not math.isfinite(value):
            return None
        text = "n" + (str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value))
    elif isinstance(value, str):
        text = "s" + value
    else:
        return None
    if len(text.encode()) > MAX_PLAIN_VALUE_BYTES:
        return "h" + hashlib.sha1(text.encode()).hexdigest()
    return text


def url_domains(url: Any) -> list[str]:
    """The host of a URL and every domain above it but the last label: docs.example.com →
    [docs.example.com, example.com]."""
    if not isinstance(url, str):
        return []
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return []
    if not host:
        return []
    labels = host.rstrip(".").split(".")
    return [".".join(labels[i:]) for i in range(max(1, len(labels) - 1))]


def range_number(kind: RangeKind, value: Any) -> float:
    try:
        return range_value(kind, value)
    except ValueError as exc:
        raise FilterError(str(exc)) from None


@dataclasses.dataclass(frozen=True, slots=True)
class FilterTerms:
    """What a document adds for filters: boolean terms and range values (analyzer.py)."""

    terms: list[str]
    values: dict[int, bytes]


def document_filter_terms(fields: dict[str, Any], ranges: dict[str, RangeKind]) -> FilterTerms:
    terms: list[str] = []
    for name, value in fields.items():
        for v in value if isinstance(value, list) else [value]:
            t = term_value(v)
            if t is not None:
                terms.append(filter_prefix(name) + t)
    terms += [filter_prefix(DOMAIN_FIELD) + "s" + d for d in url_domains(fields.get(URL_FIELD))]
    values = {}
    for name, kind in ranges.items():
        if name in fields:
            values[range_slot(name)] = xapian.sortable_serialise(range_value(kind, fields[name]))
    return FilterTerms(terms, values)


def decode_filter(data: Any, ranges: dict[str, RangeKind]) -> list[Clause]:
    """A request's `filter` object → canonical clauses (the wire form), or FilterError."""
    if not isinstance(data, dict):
        raise FilterError("filter must be an object whose keys are fields")
    if len(data) > MAX_CLAUSES:
        raise FilterError(f"filter has at most {MAX_CLAUSES} fields")
    out: list[Clause] = []
    for field, cond in sorted(data.items()):
        if field != DOMAIN_FIELD and not FIELD_NAME.match(field):
            raise FilterError(f"filter: {field[:80]!r} is not a field name")
        where = f"filter.{field}"
        if not isinstance(cond, dict):
            out.append([FilterOp.IN.value, field, _values(where, [cond])])
            continue
        unknown = sorted(set(cond) - {op.value for op in FilterOp})
        if unknown:
            raise FilterError(f"{where}: unknown operator {unknown[0][:40]!r} (use in, not_in, gte, lte)")
        if not cond:
            raise FilterError(f"{where}: an empty condition")
        for op in (FilterOp.IN, FilterOp.NOT_IN):
            if op.value in cond:
                vals = cond[op.value]
                if not isinstance(vals, list) or not vals or len(vals) > MAX_VALUES:
                    raise FilterError(f"{where}.{op.value}: a list of 1 to {MAX_VALUES} values")
                out.append([op.value, field, _values(f"{where}.{op.value}", vals)])
        if FilterOp.GTE.value in cond or FilterOp.LTE.value in cond:
            out.append(_range(where, field, cond, ranges))
    return out


def _values(where: str, values: list[Any]) -> list[str]:
    out = []
    for v in values:
        t = term_value(v)
        if t is None:
            raise FilterError(f"{where}: a value is a string, a number or a boolean")
        out.append(t)
    return sorted(set(out))


def _range(where: str, field: str, cond: dict[str, Any], ranges: dict[str, RangeKind]) -> Clause:
    kind = ranges.get(field)
    if kind is None:
        raise FilterError(
            f"{where}: gte/lte need a range field declared in search.toml's range_fields ({field!r} is not one)"
        )
    bounds = []
    for op in (FilterOp.GTE, FilterOp.LTE):
        try:
            bounds.append(range_number(kind, cond[op.value]) if op.value in cond else None)
        except FilterError as exc:
            raise FilterError(f"{where}.{op.value}: {exc}") from None
    return ["range", field, *bounds]


def check_wire(data: Any) -> list[Clause]:
    """Clauses received by a shard: well formed, or FilterError."""
    if not isinstance(data, list) or len(data) > MAX_CLAUSES * 3:
        raise FilterError("filter: a list of clauses")
    for c in data:
        ok = isinstance(c, list) and len(c) >= 3 and isinstance(c[1], str) and c[1] != ""
        if ok and c[0] in (FilterOp.IN.value, FilterOp.NOT_IN.value):
            ok = (
                len(c) == 3
                and isinstance(c[2], list)
                and 0 < len(c[2]) <= MAX_VALUES
                and all(isinstance(v, str) and v for v in c[2])
            )
        elif ok and c[0] == "range":
            ok = len(c) == 4 and all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in c[2:]
            )
        else:
            ok = False
        if not ok:
            raise FilterError("filter: a malformed clause")
    return data


def filtered(query: xapian.Query, clauses: list[Clause] | None) -> xapian.Query:
    """`query` restricted by the clauses; its weights unchanged."""
    if not clauses:
        return query
    Q = xapian.Query
    keep: list[xapian.Query] = []
    drop: list[xapian.Query] = []
    for c in clauses:
        if c[0] == "range":
            lo = xapian.sortable_serialise(-math.inf if c[2] is None else c[2])
            hi = xapian.sortable_serialise(math.inf if c[3] is None else c[3])
            keep.append(Q(Q.OP_VALUE_RANGE, range_slot(c[1]), lo, hi))
        else:
            terms = Q(Q.OP_OR, [Q(filter_prefix(c[1]) + v) for v in c[2]])
            (keep if c[0] == FilterOp.IN.value else drop).append(terms)
    if keep:
        query = Q(Q.OP_FILTER, query, Q(Q.OP_AND, keep) if len(keep) > 1 else keep[0])
    if drop:
        query = Q(Q.OP_AND_NOT, query, Q(Q.OP_OR, drop) if len(drop) > 1 else drop[0])
    return query
