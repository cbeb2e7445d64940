#!/usr/bin/env python3
"""Search: the router's and the shards' CPU per query, in one process, without sockets.

On a loaded 2-core machine the socket benchmarks (search_before_after.py, search_latency.py)
measure scheduling as much as code: run against the same tree twice, their p50s differ by up
to 2 ms. This one measures code: a router (its ASGI front, FastAPI app and searcher, as
`sluice search serve` builds them) over 2 shards whose replicas answer its requests through
their own query handlers, as JSON bytes, in this process; process CPU time is split into the
shards' part (inside the handlers) and the router's (the rest). Passes over the same 300
queries: the first meets most terms for the first time (statistics rounds, one-round
searches), later ones repeat them. The result cache is off.

Works on this tree and on an earlier checkout's (before the router's folders were named), so
two trees compare side by side; run each a few times and compare the minima:

    PYTHONPATH=src .venv/bin/python bench/search/search_router_cpu.py
    PYTHONPATH=/tmp/old/src .venv/bin/python bench/search/search_router_cpu.py
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py
from sluice.search.index.schema import parse_document
from sluice.search.router.config import parse_config
from sluice.search.router.runtime import RouterRuntime
from sluice.search.shard.replica import Replica
from sluice.search.shard.server import create_shard_app
from tests import corpus

NAMED = (Path(inspect.getfile(RouterRuntime)).parent / "http").is_dir()  # this tree's layout
if NAMED:
    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront as Front
else:  # an earlier checkout's
    from sluice.search.router.app import create_router_app  # type: ignore[no-redef]
    from sluice.search.router.fast_http.search_path import SearchFastPath as Front  # type: ignore[no-redef]

CONFIG = (
    '[search]\ncache_entries = 0\n[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n'
    '[[shards]]\nname = "b"\nreplicas = ["127.0.0.1:10"]\n'
)


def build(docs: list[dict], data: Path) -> tuple[RouterRuntime, list[float]]:
    """A router whose shard calls are answered in-process; returns it and the shards' CPU counter."""
    rt = RouterRuntime(parse_config(CONFIG), [["http://127.0.0.1:9"], ["http://127.0.0.1:10"]])
    apps = {}
    for i, s in enumerate(rt.topo.shards):
        replica = Replica(data / s.name, fsync=False)
        ops = [
            {"op": "upsert", "id": d.doc_id, "fields": d.fields}
            for d in map(parse_document, docs)
            if rt.topo.shard_for(d) == i
        ]
        replica.append(1, ops)
        apps[s.replicas[0].url] = create_shard_app(replica)
        s.head_seq = 1
    shard_cpu = [0.0]

    async def call(shard, path, payload, deadline, phase, prefer=None):  # the shard caller's interface
        t0 = time.process_time()
        r = shard.replicas[0]
        qp = apps[r.url]
        _, body = qp.answer(qp.handlers[path], json.dumps(payload, separators=(",", ":")).encode())
        out = json.loads(body)
        shard_cpu[0] += time.process_time() - t0
        return r, out

    # Any: this tree's ShardCaller or an earlier checkout's shard client (its rt.client), whose
    # call is replaced on this instance only
    caller: Any = rt.caller if hasattr(rt, "caller") else vars(rt)["client"]
    caller.call = call
    return rt, shard_cpu


EXTRA: dict = {}  # --snippets N: {"snippet_chars": N} in every body (a tree without snippets refuses the field)


async def one(front, query: str) -> None:
    body = json.dumps({"query": query, "top_k": 10, **EXTRA}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/search",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict) -> None:
        sent.append(msg)

    await front(scope, receive, send)
    assert sent[0]["status"] == 200, sent


async def run(args: argparse.Namespace) -> list[dict]:
    docs = corpus.documents(args.docs)
    queries = corpus.queries(docs, args.queries, seed=3)
    rt, shard_cpu = build(docs, Path(tempfile.mkdtemp(prefix="sluice-search-cpu-")))
    front = Front(create_router_app(rt), rt)
    for q in corpus.queries(docs, 100, seed=99):  # warm-up with other queries
        await one(front, q)
    # the corpus and the indexes out of the collector's way: a full collection over them, landing
    # in one pass or another, would be the largest difference between two runs
    gc.collect()
    gc.freeze()
    out = []
    for p in range(1, args.passes + 1):
        shard_cpu[0] = 0.0
        t0 = time.process_time()
        for q in queries:
            await one(front, q)
        total = time.process_time() - t0
        out.append(
            {
                "pass": p,
                "router_cpu_ms_per_query": round(1000 * (total - shard_cpu[0]) / len(queries), 3),
                "shards_cpu_ms_per_query": round(1000 * shard_cpu[0] / len(queries), 3),
            }
        )
        print(json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument(
        "--snippets",
        type=int,
        default=None,
        help="snippet_chars in every body (unset: the field is "
        "not sent, and a tree with snippets makes its default 300-character ones)",
    )
    ap.add_argument("--profile", default=None, help="write a cProfile of the run to this file")
    args = ap.parse_args()
    if args.snippets is not None:
        EXTRA["snippet_chars"] = args.snippets
    if args.profile:
        import cProfile

        cProfile.runctx("asyncio.run(run(args))", globals(), {"args": args, "run": run}, args.profile)
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
