"""The search service's operations, in one place, as quickwit's `SearchService` lists its RPCs.

    SearchService   what a client asks the router: search, write (a bulk NDJSON body),
                    delete, status. The router implements it (router/runtime.py); the HTTP
                    API (router/http/) is one front over it, decoding and rendering only.
    ShardService    what the router asks a shard in a query: its statistics and its search.
                    A replica process implements it (shard/replica.py, reached over HTTP through
                    shard/server.py), and so does a cold shard the router opened itself
                    (tiers/cold_tier.py) — the same answers, from the same code
                    (shard/answers.py).

Every message is a type of search/contract.py. Interfaces are Protocols: they say what is
offered, and a test or another front can stand in for either side.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from sluice.search.contract import (
    BulkAnswer,
    DeleteAnswer,
    SearchRequest,
    SearchResponse,
    ShardSearchAnswer,
    ShardSearchRequest,
    StatsAnswer,
    StatsRequest,
)


@runtime_checkable
class SearchService(Protocol):
    async def search(self, request: SearchRequest) -> SearchResponse:
        """The top hits across every shard, merged exactly; `partial` names the shards missing.
        Raises SearchError (query_syntax_error with its position) for a query that does not parse."""
        ...

    async def write(self, ndjson: bytes) -> BulkAnswer:
        """Upsert one document per line; bad lines are reported by number, the rest written;
        the answer names the shards whose part was written and those whose part was not."""
        ...

    async def delete(self, doc_id: str) -> DeleteAnswer:
        """Delete a document wherever it may be (idempotent)."""
        ...

    def status(self) -> dict[str, Any]:
        """Shards, replicas, latencies, applied entries, freshness, caches (/v1/search/status)."""
        ...


@runtime_checkable
class ShardService(Protocol):
    def stats(self, request: StatsRequest) -> StatsAnswer:
        """The shard's counts, its frequency of each term, and each prefix's terms."""
        ...

    def search(self, request: ShardSearchRequest) -> ShardSearchAnswer:
        """The shard's top_k, scored with the global statistics given (or its own)."""
        ...
