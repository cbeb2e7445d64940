"""The shard replica's HTTP interface (internal: the router is its only client).

    GET  /health, /ready, /metrics, /v1/shard/status
    POST /v1/shard/append    {"seq", "ops", "ts"}  → {"applied_seq"}; 409 {"last_seq"} on a gap
    GET  /v1/shard/log?after=N&limit=M            → {"entries", "last_seq"} (peers catch up from it);
                                                      410 {"log_base"} when entries after N were compacted
    POST /v1/shard/catch_up  {"peer": URL}          → copy missing entries (or the index) from a peer
    GET  /v1/shard/snapshot                        → a tar of a consistent copy of the index
                                                      (header x-sluice-applied-seq: its entry)
    POST /v1/shard/compact   {"upto": N}            → drop log entries ≤ N that are in a durable index
    POST /v1/shard/stats     {"terms"}              → this shard's collection statistics (phase 1)
    POST /v1/shard/search    {"tree", "top_k", "stats"} → hits scored with the given global
                                                      statistics, or this shard's own when null;
                             with "unknown": [terms]  → also "term_freqs" and per-hit "parts" of
                                                      those terms (a one-round search)

Queries run on the event loop thread (a Xapian call is ~1 ms and holds the index lock anyway);
writes and catch-up run in the thread pool so a slow fsync or peer does not stall /health.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.background import BackgroundTask
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from sluice.search import strict_json
from sluice.search.errors import DocumentError, QuerySyntaxError
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.query_tree import check_tree, scored_leaves
from sluice.search.index.shard_index import MAX_TOP_K
from sluice.search.shard.replica import Replica
from sluice.search.shard import snapshot
from sluice.search.shard.query_path import QueryPath
from sluice.search.shard.write_log import LogCompactedError, LogGapError

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": {"message": message, **extra}}, status_code=status)


def create_shard_app(replica: Replica) -> QueryPath:
    app = FastAPI(title="sluice search shard", version="1", docs_url=None, redoc_url=None)
    reg = CollectorRegistry()
    latency = Histogram("sluice_search_shard_op_seconds", "Time in the index per operation", ["op"],
                        buckets=_BUCKETS, registry=reg)
    errors = Counter("sluice_search_shard_errors", "Refused shard requests by type", ["type"], registry=reg)
    applied = Gauge("sluice_search_shard_applied_seq", "Last write-log entry applied to the index", registry=reg)
    applied.set_function(lambda: replica.applied_seq)
    started = time.time()

    async def body(request: Request) -> dict[str, Any]:
        try:
            data = strict_json.loads(await request.body())
        except strict_json.JsonError as exc:
            raise DocumentError(f"invalid body: {exc}") from None
        if not isinstance(data, dict):
            raise DocumentError("the body must be a JSON object")
        return data

    @app.exception_handler(DocumentError)
    async def _bad_doc(request: Request, exc: DocumentError) -> JSONResponse:
        errors.labels("bad_request").inc()
        return _error(400, str(exc))

    @app.exception_handler(QuerySyntaxError)
    async def _bad_query(request: Request, exc: QuerySyntaxError) -> JSONResponse:
        errors.labels("bad_query").inc()
        return _error(400, str(exc))

    @app.exception_handler(ValueError)
    async def _bad_value(request: Request, exc: ValueError) -> JSONResponse:
        errors.labels("bad_request").inc()
        return _error(400, f"invalid request: {exc}")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        return {"status": "ready", "applied_seq": replica.applied_seq}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(reg), media_type="text/plain; version=0.0.4")

    @app.get("/v1/shard/status")
    async def status() -> dict[str, Any]:
        return {**replica.status(), "uptime_s": time.time() - started}

    @app.post("/v1/shard/append")
    async def append(request: Request) -> JSONResponse:
        data = await body(request)
        seq, ops, ts = data.get("seq"), data.get("ops"), data.get("ts")
        if not isinstance(seq, int) or seq < 1:
            raise DocumentError("seq must be an integer >= 1")
        t0 = time.perf_counter()
        try:
            applied_seq = await run_in_threadpool(replica.append, seq, ops, float(ts) if ts else None)
        except LogGapError as exc:
            return _error(409, str(exc), last_seq=exc.last_seq)
        latency.labels("append").observe(time.perf_counter() - t0)
        return JSONResponse({"applied_seq": applied_seq})

    @app.get("/v1/shard/log")
    async def read_log(after: int = 0, limit: int = 500) -> JSONResponse:
        try:
            entries = await run_in_threadpool(replica.log.read, max(0, after), max(1, min(limit, 5000)))
        except LogCompactedError as exc:
            return _error(410, f"{exc}; copy this replica's index (/v1/shard/snapshot)", log_base=exc.base)
        return JSONResponse({"entries": entries, "last_seq": replica.log.last_seq})

    @app.get("/v1/shard/snapshot")
    async def get_snapshot() -> FileResponse:
        tmp = Path(tempfile.mkdtemp(prefix="snapshot-", dir=replica.data_dir))

        def make() -> int:
            seq = replica.write_snapshot(tmp / "index")
            snapshot.pack(tmp / "index", tmp / "index.tar")
            return seq

        t0 = time.perf_counter()
        try:
            seq = await run_in_threadpool(make)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        latency.labels("snapshot").observe(time.perf_counter() - t0)
        return FileResponse(tmp / "index.tar", media_type="application/x-tar",
                            headers={"x-sluice-applied-seq": str(seq)},
                            background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True))

    @app.post("/v1/shard/compact")
    async def compact(request: Request) -> dict[str, Any]:
        upto = (await body(request)).get("upto")
        if not isinstance(upto, int) or upto < 0:
            raise DocumentError("upto must be an integer >= 0")
        dropped = await run_in_threadpool(replica.compact, upto)
        return {"dropped": dropped, "log_base": replica.log.base, "logged_seq": replica.log.last_seq}

    @app.post("/v1/shard/catch_up")
    async def catch_up(request: Request) -> JSONResponse:
        peer = (await body(request)).get("peer")
        if not isinstance(peer, str) or not peer.startswith("http"):
            raise DocumentError("peer must be an http(s) URL")
        try:
            applied_seq = await run_in_threadpool(replica.catch_up, peer)
        except Exception as exc:  # the peer is down or diverged: say so, the router tries another
            errors.labels("catch_up").inc()
            return _error(502, f"catch-up from {peer} failed: {type(exc).__name__}: {exc}"[:500])
        return JSONResponse({"applied_seq": applied_seq})

    # the query path: plain ASGI in front of FastAPI (query_path.py)
    def stats(data: dict[str, Any]) -> dict[str, Any]:
        terms, prefixes = data.get("terms"), data.get("prefixes", [])
        if not isinstance(terms, list) or len(terms) > 1024 or not all(isinstance(t, str) for t in terms):
            raise DocumentError("terms must be a list of at most 1024 strings")
        if not isinstance(prefixes, list) or len(prefixes) > 64 or not all(isinstance(p, str) and p for p in prefixes):
            raise DocumentError("prefixes must be a list of at most 64 non-empty strings")
        t0 = time.perf_counter()
        st, expansions, seq = replica.stats(terms, prefixes)
        latency.labels("stats").observe(time.perf_counter() - t0)
        return {**st.to_json(), "applied_seq": seq, **({"expansions": expansions} if prefixes else {})}

    def search(data: dict[str, Any]) -> dict[str, Any]:
        tree = data.get("tree")
        tree = None if tree is None else check_tree(tree)
        top_k = data.get("top_k", 10)
        if not isinstance(top_k, int) or not 0 <= top_k <= MAX_TOP_K:
            raise DocumentError(f"top_k must be an integer from 0 to {MAX_TOP_K}")
        st = data.get("stats")
        glob = None if st is None else CollectionStats.from_json(st)
        unknown = data.get("unknown")
        t0 = time.perf_counter()
        if unknown is None:
            hits, seq = replica.search(tree, top_k, glob)
            extra: dict[str, Any] = {}
        else:  # a one-round search (router/global_stats/one_round.py)
            scored = scored_leaves(tree)
            if (glob is None or scored is None or not isinstance(unknown, list) or len(unknown) > 1024
                    or not all(isinstance(t, str) for t in unknown)):
                raise DocumentError("unknown needs global stats, a tree without phrases and at most 1024 terms")
            hits, freqs, parts, seq = replica.search_with_parts(tree, top_k, glob, unknown, scored)
            extra = {"term_freqs": freqs, "parts": parts}
        took = time.perf_counter() - t0
        latency.labels("search").observe(took)
        return {"hits": [h.to_json() for h in hits], "applied_seq": seq, "index_s": took, **extra}

    return QueryPath(app, {"/v1/shard/stats": stats, "/v1/shard/search": search},
                     lambda kind: errors.labels(kind).inc())

