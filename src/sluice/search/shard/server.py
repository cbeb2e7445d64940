"""The shard replica's HTTP interface (internal: the router is its only client).

    GET  /health, /ready, /metrics, /v1/shard/status
    POST /v1/shard/append    {"seq", "ops", "ts"}  → {"applied_seq"}; 409 {"last_seq"} on a gap
    GET  /v1/shard/log?after=N&limit=M            → {"entries", "last_seq"} (peers catch up from it);
                                                      410 {"log_base"} when entries after N were compacted
    POST /v1/shard/catch_up  {"peer": URL}          → copy missing entries (or the index) from a peer
    GET  /v1/shard/snapshot                        → a tar of a consistent copy of the index
                                                      (header x-sluice-applied-seq: its entry)
    POST /v1/shard/compact   {"upto": N}            → drop log entries ≤ N that are in a durable index
    POST /v1/shard/stats     StatsRequest           → StatsAnswer: this shard's statistics, and the
                                                      terms each wildcard prefix expands to
    POST /v1/shard/search    ShardSearchRequest     → ShardSearchAnswer: hits scored with the given
                                                      global statistics (or this shard's own), and for
                                                      a one-round search each unknown term's parts
    (the two query requests are typed messages of search/contract.py, decoded there)

Errors are `{"error": {"type", "message", ...}}`, the type a SearchErrorKind (errors.py) whose
status is the answer's: 400 for a bad request, 409 `log_gap` (with `last_seq`), 410
`log_compacted` (with `log_base`), 413, 502 `catch_up_failed`.

Queries run on the event loop thread (a Xapian call is ~1 ms and holds the index lock anyway);
writes and catch-up run in the thread pool so a slow fsync or peer does not stall /health.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.background import BackgroundTask

from sluice.search import strict_json
from sluice.search.contract import ShardSearchRequest, StatsRequest
from sluice.search.errors import DocumentError, QuerySyntaxError, SearchError, SearchErrorKind
from sluice.search.shard import snapshot
from sluice.search.shard.query_path import Handler, QueryPath
from sluice.search.shard.replica import Replica
from sluice.search.shard.write_log import LogCompactedError, LogGapError

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclasses.dataclass(slots=True)
class _ShardMetrics:
    registry: CollectorRegistry
    latency: Histogram  # time in the index per operation
    refused: Counter  # refused requests by type

    @classmethod
    def of(cls, replica: Replica) -> _ShardMetrics:
        reg = CollectorRegistry()
        applied = Gauge("sluice_search_shard_applied_seq", "Last write-log entry applied to the index", registry=reg)
        applied.set_function(lambda: replica.applied_seq)
        return cls(
            reg,
            Histogram(
                "sluice_search_shard_op_seconds",
                "Time in the index per operation",
                ["op"],
                buckets=_BUCKETS,
                registry=reg,
            ),
            Counter("sluice_search_shard_errors", "Refused shard requests by type", ["type"], registry=reg),
        )

    def count(self, kind: str) -> None:
        self.refused.labels(kind).inc()


def _error(kind: SearchErrorKind, message: str, **extra: Any) -> JSONResponse:
    err = SearchError(kind, message, **extra)
    return JSONResponse(err.body(), status_code=err.status)


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = strict_json.loads(await request.body())
    except strict_json.JsonError as exc:
        raise DocumentError(f"invalid body: {exc}") from None
    if not isinstance(data, dict):
        raise DocumentError("the body must be a JSON object")
    return data


def create_shard_app(replica: Replica) -> QueryPath:
    m = _ShardMetrics.of(replica)
    app = FastAPI(title="sluice search shard", version="1", docs_url=None, redoc_url=None)
    _add_error_handlers(app, m)
    _add_state_routes(app, replica, m)
    _add_write_routes(app, replica, m)
    _add_copy_routes(app, replica, m)
    # the query path: in front of FastAPI (query_path.py, and query_protocol.py inside uvicorn)
    return QueryPath(app, _query_handlers(replica, m), m.count)


def _query_handlers(replica: Replica, m: _ShardMetrics) -> dict[str, Handler]:
    """The two query requests, decoded through the contract and answered by the replica."""

    def stats(data: dict[str, Any]) -> dict[str, Any]:
        req = StatsRequest.decode(data)
        t0 = time.perf_counter()
        answer = replica.stats(req)
        m.latency.labels("stats").observe(time.perf_counter() - t0)
        return answer.to_json()

    def search(data: dict[str, Any]) -> dict[str, Any]:
        req = ShardSearchRequest.decode(data)
        t0 = time.perf_counter()
        answer = replica.search(req)
        answer.index_s = time.perf_counter() - t0
        m.latency.labels("search").observe(answer.index_s)
        return answer.to_json()

    return {StatsRequest.PATH: stats, ShardSearchRequest.PATH: search}


def _add_error_handlers(app: FastAPI, m: _ShardMetrics) -> None:
    @app.exception_handler(SearchError)
    async def _refused(request: Request, exc: SearchError) -> JSONResponse:
        m.count("bad_request")
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(DocumentError)
    async def _bad_doc(request: Request, exc: DocumentError) -> JSONResponse:
        m.count("bad_request")
        return _error(SearchErrorKind.INVALID_REQUEST, str(exc))

    @app.exception_handler(QuerySyntaxError)
    async def _bad_query(request: Request, exc: QuerySyntaxError) -> JSONResponse:
        m.count("bad_query")
        return _error(SearchErrorKind.QUERY_SYNTAX, str(exc))

    @app.exception_handler(ValueError)
    async def _bad_value(request: Request, exc: ValueError) -> JSONResponse:
        m.count("bad_request")
        return _error(SearchErrorKind.INVALID_REQUEST, f"invalid request: {exc}")


def _add_state_routes(app: FastAPI, replica: Replica, m: _ShardMetrics) -> None:
    started = time.time()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> dict[str, Any]:
        return {"status": "ready", "applied_seq": replica.applied_seq}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type="text/plain; version=0.0.4")

    @app.get("/v1/shard/status")
    async def status() -> dict[str, Any]:
        return {**replica.status(), "uptime_s": time.time() - started}


def _add_write_routes(app: FastAPI, replica: Replica, m: _ShardMetrics) -> None:
    """Writes, compaction and catch-up run in the thread pool: a slow fsync or peer must not
    stall /health or the query path."""

    @app.post("/v1/shard/append")
    async def append(request: Request) -> JSONResponse:
        data = await _body(request)
        seq, ops, ts = data.get("seq"), data.get("ops"), data.get("ts")
        if not isinstance(seq, int) or seq < 1:
            raise DocumentError("seq must be an integer >= 1")
        t0 = time.perf_counter()
        try:
            applied_seq = await run_in_threadpool(replica.append, seq, ops, float(ts) if ts else None)
        except LogGapError as exc:
            return _error(SearchErrorKind.LOG_GAP, str(exc), last_seq=exc.last_seq)
        m.latency.labels("append").observe(time.perf_counter() - t0)
        return JSONResponse({"applied_seq": applied_seq})

    @app.post("/v1/shard/compact")
    async def compact(request: Request) -> dict[str, Any]:
        upto = (await _body(request)).get("upto")
        if not isinstance(upto, int) or upto < 0:
            raise DocumentError("upto must be an integer >= 0")
        dropped = await run_in_threadpool(replica.compact, upto)
        return {"dropped": dropped, "log_base": replica.log.base, "logged_seq": replica.log.last_seq}

    @app.post("/v1/shard/catch_up")
    async def catch_up(request: Request) -> JSONResponse:
        peer = (await _body(request)).get("peer")
        if not isinstance(peer, str) or not peer.startswith("http"):
            raise DocumentError("peer must be an http(s) URL")
        try:
            applied_seq = await run_in_threadpool(replica.catch_up, peer)
        except Exception as exc:  # the peer is down or diverged: say so, the router tries another
            m.count("catch_up")
            return _error(
                SearchErrorKind.CATCH_UP_FAILED, f"catch-up from {peer} failed: {type(exc).__name__}: {exc}"[:500]
            )
        return JSONResponse({"applied_seq": applied_seq})


def _add_copy_routes(app: FastAPI, replica: Replica, m: _ShardMetrics) -> None:
    """What a peer copies: log entries, or a consistent copy of the index."""

    @app.get("/v1/shard/log")
    async def read_log(after: int = 0, limit: int = 500) -> JSONResponse:
        try:
            entries = await run_in_threadpool(replica.log.read, max(0, after), max(1, min(limit, 5000)))
        except LogCompactedError as exc:
            return _error(
                SearchErrorKind.LOG_COMPACTED,
                f"{exc}; copy this replica's index (/v1/shard/snapshot)",
                log_base=exc.base,
            )
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
        m.latency.labels("snapshot").observe(time.perf_counter() - t0)
        return FileResponse(
            tmp / "index.tar",
            media_type="application/x-tar",
            headers={"x-sluice-applied-seq": str(seq)},
            background=BackgroundTask(shutil.rmtree, tmp, ignore_errors=True),
        )
