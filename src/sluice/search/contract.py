"""The search service's messages, typed, with their bounds written once.

    the router's search   SearchRequest → SearchResponse        POST /v1/search
    the statistics round  StatsRequest → StatsAnswer            POST /v1/shard/stats
    the shard's search    ShardSearchRequest → ShardSearchAnswer POST /v1/shard/search
    writes                BulkAnswer, DeleteAnswer               POST /v1/search/documents, DELETE

Every entry point decodes through here — the router's ASGI front and its FastAPI route
(`SearchRequest.decode`), the shard's two query entry points (shard/query_path.py and
shard/query_protocol.py, through the handlers of shard/server.py), the router reading the
shards' answers — and the cold tier is handed these typed requests in-process (service.py's
ShardService). A request that does not decode is a `SearchError` (its kind is its status and
wire type, errors.py); an answer that does not decode is a ValueError, which the router counts
as that shard failing. The wire form is JSON; `to_json` writes it, `decode` reads it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, ClassVar

import numpy as np

from sluice.search import strict_json
from sluice.search.dense import vectors
from sluice.search.errors import SearchError, SearchErrorKind
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.filters import Clause, FilterError, check_wire, decode_filter
from sluice.search.index.hits import Hit
from sluice.search.index.query_syntax import MAX_QUERY_CHARS
from sluice.search.index.query_tree import Tree, check_tree, scored_leaves
from sluice.search.index.schema import RangeKind
from sluice.search.index.snippets import MAX_SNIPPET_CHARS
from sluice.search.retrieval import HybridOptions, RetrievalMode, decode_mode

DEFAULT_TOP_K = 10
MIN_TOP_K = 0
MAX_TOP_K = 1000  # what a shard answers at most; the router's configured max_top_k is within it
# a query of MAX_QUERY_CHARS characters, each escaped as \uXXXX (6 bytes), and room to spare; a
# body over it is refused as soon as it passes it, never read whole
MAX_SEARCH_BODY_BYTES = 64 << 10
MAX_TERMS = 1024  # terms in one statistics request or one-round search
MAX_PREFIXES = 64  # wildcard prefixes in one statistics request (at most one per query clause)
DEFAULT_SNIPPET_CHARS = 300
SEARCH_FIELDS = frozenset({"query", "top_k", "snippet_chars", "filter", "mode", "hybrid"})

_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_number = float.__repr__  # a finite float as json writes it

__all__ = [
    "DEFAULT_SNIPPET_CHARS",
    "MAX_SNIPPET_CHARS",
    "DEFAULT_TOP_K",
    "MAX_QUERY_CHARS",
    "MAX_TOP_K",
    "MIN_TOP_K",
    "SearchRequest",
    "SearchResponse",
    "StatsRequest",
    "StatsAnswer",
    "ShardSearchRequest",
    "ShardSearchAnswer",
    "BulkAnswer",
    "DeleteAnswer",
]


def _invalid(message: str) -> SearchError:
    return SearchError(SearchErrorKind.INVALID_REQUEST, message)


def _object(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _invalid("the body must be a JSON object")
    return data


def _strings(value: Any, name: str, most: int) -> list[str]:
    if not isinstance(value, list) or len(value) > most or not all(isinstance(t, str) and t for t in value):
        raise _invalid(f"{name} must be a list of at most {most} non-empty strings")
    return value


def _bounded_int(value: Any, name: str, least: int, most: int) -> int:
    if type(value) is not int:
        raise _invalid(f"{name}: an integer is required")
    if not least <= value <= most:
        raise _invalid(f"{name} is from {least} to {most}")
    return value


def _top_k(value: Any, most: int) -> int:
    if type(value) is not int:
        raise _invalid("top_k: an integer is required")
    if value < MIN_TOP_K:
        raise _invalid(f"top_k is at least {MIN_TOP_K}")
    if value > most:
        raise _invalid(f"top_k is at most {most}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class SearchRequest:
    """The body of POST /v1/search."""

    query: str
    top_k: int = DEFAULT_TOP_K
    snippet_chars: int = DEFAULT_SNIPPET_CHARS  # each hit's snippet at most this long (0: none)
    filter: list[Clause] | None = None  # canonical clauses (index/filters.py); None: every document
    mode: RetrievalMode = RetrievalMode.LEXICAL
    hybrid: HybridOptions | None = None  # mode hybrid's options (retrieval.py)

    def options_key(self) -> tuple[Any, ...]:
        """Everything but the query that changes the answer (the result cache's key)."""
        return (
            self.top_k,
            self.snippet_chars,
            None if self.filter is None else json.dumps(self.filter, separators=(",", ":")),
            self.mode.value,
            None if self.hybrid is None else self.hybrid.key(),
        )

    @classmethod
    def decode(cls, body: bytes, max_top_k: int, ranges: dict[str, RangeKind] | None = None) -> SearchRequest:
        """`ranges`: the fields a filter may bound (search.toml's range_fields)."""
        try:
            data = _object(strict_json.loads(body))
        except strict_json.JsonError as exc:
            raise _invalid(f"invalid body: {exc}") from None
        extra = sorted(set(data) - SEARCH_FIELDS)
        if extra:
            raise _invalid(f"extra fields not permitted: {', '.join(repr(k[:40]) for k in extra[:5])}")
        query = data.get("query")
        if not isinstance(query, str):
            raise _invalid("query: a string is required")
        if len(query) > MAX_QUERY_CHARS:
            raise _invalid(f"query: at most {MAX_QUERY_CHARS} characters")
        clauses = None
        if data.get("filter") is not None:
            try:
                clauses = decode_filter(data["filter"], ranges or {}) or None
            except FilterError as exc:
                raise _invalid(str(exc)) from None
        top_k = _top_k(data.get("top_k", DEFAULT_TOP_K), max_top_k)
        mode = decode_mode(data.get("mode", RetrievalMode.LEXICAL.value))
        if data.get("hybrid") is not None and mode is not RetrievalMode.HYBRID:
            raise _invalid('hybrid: only with "mode": "hybrid"')
        hybrid = HybridOptions.decode(data.get("hybrid"), top_k) if mode is RetrievalMode.HYBRID else None
        return cls(
            query,
            top_k,
            _bounded_int(data.get("snippet_chars", DEFAULT_SNIPPET_CHARS), "snippet_chars", 0, MAX_SNIPPET_CHARS),
            clauses,
            mode,
            hybrid,
        )


@dataclasses.dataclass(slots=True)
class SearchResponse:
    hits: list[Hit]
    shards: int
    shards_answered: int
    failed: dict[str, str]  # shard name → why (a ShardFailure: timeout, unavailable)
    took_ms: float = 0.0
    cached: bool = False

    @property
    def partial(self) -> bool:
        return self.shards_answered < self.shards

    def _summary(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shards_answered": self.shards_answered,
            "partial": self.partial,
            "failed_shards": self.failed,
            "took_ms": round(self.took_ms, 3),
            "cached": self.cached,
        }

    def to_json(self) -> dict[str, Any]:
        return {"hits": [h.to_json() for h in self.hits], **self._summary()}

    def json_bytes(self) -> bytes:
        """to_json()'s JSON, written without decoding the hits' stored fields (Hit.json_text)."""
        hits = ",".join([h.json_text() for h in self.hits])
        # the summary's fields as _summary() has them, written directly (json.dumps' Python
        # layers cost more than the rest of the summary); the failures' names through json
        failed = "{}" if not self.failed else _compact(self.failed)
        return (
            f'{{"hits":[{hits}],"shards":{self.shards:d},"shards_answered":{self.shards_answered:d},'
            f'"partial":{"true" if self.partial else "false"},"failed_shards":{failed},'
            f'"took_ms":{_number(round(self.took_ms, 3))},"cached":{"true" if self.cached else "false"}}}'
        ).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class StatsRequest:
    """The statistics round: a shard's counts, its frequency of each term, and the index terms
    each wildcard prefix expands to."""

    PATH: ClassVar[str] = "/v1/shard/stats"
    PHASE: ClassVar[str] = "stats"
    terms: list[str]
    prefixes: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"terms": self.terms, **({"prefixes": self.prefixes} if self.prefixes else {})}

    @classmethod
    def decode(cls, data: Any) -> StatsRequest:
        data = _object(data)
        return cls(
            _strings(data.get("terms"), "terms", MAX_TERMS),
            _strings(data.get("prefixes", []), "prefixes", MAX_PREFIXES),
        )


@dataclasses.dataclass(slots=True)
class StatsAnswer:
    stats: CollectionStats
    applied_seq: int  # the write-log entry the shard had applied (-1: unknown)
    expansions: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # prefix → {term: freq}

    def to_json(self) -> dict[str, Any]:
        return {
            **self.stats.to_json(),
            "applied_seq": self.applied_seq,
            **({"expansions": self.expansions} if self.expansions else {}),
        }

    @classmethod
    def decode(cls, data: dict[str, Any]) -> StatsAnswer:
        seq = data.get("applied_seq")
        expansions = data.get("expansions", {})
        if not isinstance(expansions, dict) or not all(
            isinstance(p, str)
            and isinstance(terms, dict)
            and all(isinstance(t, str) and t.startswith(p) and isinstance(f, int) for t, f in terms.items())
            for p, terms in expansions.items()
        ):
            raise ValueError("malformed expansions")
        return cls(CollectionStats.from_json(data), seq if isinstance(seq, int) else -1, expansions)


@dataclasses.dataclass(frozen=True, slots=True)
class ShardSearchRequest:
    """One shard's top_k for a resolved tree, scored with `stats` (the global statistics; None:
    the shard's own). With `unknown`, a one-round search (router/query/global_stats/one_round.py):
    those terms' frequencies are not in `stats`, the shard scores them with its own and reports
    them and their part of each hit's score."""

    PATH: ClassVar[str] = "/v1/shard/search"
    PHASE: ClassVar[str] = "search"
    tree: Tree | None
    top_k: int = DEFAULT_TOP_K
    stats: CollectionStats | None = None
    unknown: list[str] | None = None
    filter: list[Clause] | None = None
    vector: np.ndarray | None = None  # a dense search: the query's vector (the tree is then None)
    exact: bool | None = None  # a dense search's way (None: exact on a small shard; vector_index.py)
    pruned: bool = False  # a lexical ranking by Xapian's early termination (index/ranking.py)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tree": self.tree,
            "top_k": self.top_k,
            "stats": None if self.stats is None else self.stats.to_json(),
        }
        if self.unknown is not None:
            out["unknown"] = self.unknown
        if self.filter:
            out["filter"] = self.filter
        if self.vector is not None:
            out["vector"], out["exact"] = vectors.encode(self.vector), self.exact
        if self.pruned:
            out["pruned"] = True
        return out

    @classmethod
    def decode(cls, data: Any) -> ShardSearchRequest:
        """QuerySyntaxError for a malformed tree (check_tree), SearchError for the rest."""
        data = _object(data)
        tree = data.get("tree")
        tree = None if tree is None else check_tree(tree)
        raw_stats = data.get("stats")
        try:
            stats = None if raw_stats is None else CollectionStats.from_json(_object(raw_stats))
        except ValueError as exc:
            raise _invalid(f"stats: {exc}") from None
        unknown = data.get("unknown")
        if unknown is not None:
            unknown = _strings(unknown, "unknown", MAX_TERMS)
            if stats is None or scored_leaves(tree) is None:
                raise _invalid("unknown needs global stats and a tree without phrases")
        try:
            clauses = None if data.get("filter") is None else check_wire(data["filter"])
            vector = None if data.get("vector") is None else vectors.decode(data["vector"])
        except (FilterError, ValueError) as exc:
            raise _invalid(str(exc)) from None
        exact = data.get("exact")
        if exact is not None and not isinstance(exact, bool):
            raise _invalid("exact: true, false or null")
        if vector is not None and (tree is not None or unknown is not None):
            raise _invalid("a dense search (vector) has no tree")
        pruned = data.get("pruned", False)
        if not isinstance(pruned, bool):
            raise _invalid("pruned: true or false")
        top_k = _top_k(data.get("top_k", DEFAULT_TOP_K), MAX_TOP_K)
        return cls(tree, top_k, stats, unknown, clauses, vector, exact, pruned)


@dataclasses.dataclass(slots=True)
class ShardSearchAnswer:
    hits: list[Hit]  # ranked by the shard's scores
    applied_seq: int  # the write-log entry the shard had applied (-1: unknown)
    index_s: float | None = None  # time inside the index (the hot-shard signal)
    term_freqs: dict[str, int] | None = None  # one-round: the shard's frequency of each unknown term
    parts: list[dict[str, float]] | None = None  # one-round: per hit, each unknown term's part of its score

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hits": [h.to_json() for h in self.hits], "applied_seq": self.applied_seq}
        if self.index_s is not None:
            out["index_s"] = self.index_s
        if self.term_freqs is not None:
            out["term_freqs"], out["parts"] = self.term_freqs, self.parts
        return out

    @classmethod
    def decode(cls, data: dict[str, Any]) -> ShardSearchAnswer:
        hits = [Hit.from_json(h) for h in data["hits"]]
        seq, index_s = data.get("applied_seq"), data.get("index_s")
        freqs, parts = data.get("term_freqs"), data.get("parts")
        if freqs is not None:
            if not isinstance(freqs, dict) or not all(
                isinstance(t, str) and isinstance(f, int) for t, f in freqs.items()
            ):
                raise ValueError("malformed term_freqs")
            if not isinstance(parts, list) or len(parts) != len(hits) or not all(isinstance(p, dict) for p in parts):
                raise ValueError("parts do not match the hits")
        return cls(
            hits,
            seq if isinstance(seq, int) else -1,
            float(index_s) if isinstance(index_s, (int, float)) else None,
            freqs,
            parts,
        )


@dataclasses.dataclass(slots=True)
class WriteOutcome:
    written: dict[str, int]  # shard → the write-log entry holding its part
    failed: dict[str, str]  # shard → why its part was not written

    def to_json(self) -> dict[str, Any]:
        return {"written": self.written, "failed": self.failed}


@dataclasses.dataclass(slots=True)
class BulkAnswer:
    accepted: int
    errors: list[dict[str, Any]]  # {"line", "message"} per refused line
    outcome: WriteOutcome

    def to_json(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "errors": self.errors, **self.outcome.to_json()}


@dataclasses.dataclass(slots=True)
class DeleteAnswer:
    deleted: str
    outcome: WriteOutcome

    def to_json(self) -> dict[str, Any]:
        return {"deleted": self.deleted, **self.outcome.to_json()}
