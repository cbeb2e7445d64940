"""A search router in this process with local reads over 2 (or N) shards whose indexes a
Replica wrote here (entry 1 holds every document): the query path of `sluice search serve`'s
embedded default without its processes and sockets. For tests and benches that look at that
path itself (tests/unit/search/test_query_garbage.py, test_query_then_fetch.py,
bench/search/search_gc.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from sluice.search.contract import SearchRequest
from sluice.search.index.schema import parse_document
from sluice.search.router.config import parse_config
from sluice.search.router.runtime import RouterRuntime
from sluice.search.shard.replica import Replica


def _config(names: str, settings: str) -> str:
    shards = "".join(f'[[shards]]\nname = "{n}"\nreplicas = ["127.0.0.1:{9 + i}"]\n' for i, n in enumerate(names))
    return "[search]\nlocal_reads = true\nvectors = false\n" + settings + shards


def local_router(docs: list, data: Path, shards: int = 2, settings: str = "") -> RouterRuntime:
    """The router (its result cache on, global statistics) over `docs` in `shards` shards, their
    indexes under `data`; `settings`: more lines of search.toml's [search]. Its replica URLs
    name closed ports: every query is answered by the local readers."""
    names = "abcdefgh"[:shards]
    dirs = {i: data / n / "index" for i, n in enumerate(names)}
    urls = [[f"http://127.0.0.1:{9 + i}"] for i in range(shards)]
    rt = RouterRuntime(parse_config(_config(names, settings)), urls, local_dirs=dirs)
    for i, s in enumerate(rt.topo.shards):
        ops = [
            {"op": "upsert", "id": d.doc_id, "fields": d.fields}
            for d in map(parse_document, docs)
            if rt.topo.shard_for(d) == i
        ]
        Replica(data / s.name, fsync=False).append(1, ops)
        s.head_seq = 1
    return rt


def answers(rt: RouterRuntime, queries: list[str], **ask: Any) -> list[dict]:
    """Each query's answer as a client reads it (decoded through the contract, searched, its
    JSON), without `took_ms`; `ask`: the rest of each request's body."""

    async def run() -> list[dict]:
        out = []
        for q in queries:
            body = json.dumps({"query": q, **ask}).encode()
            got = json.loads((await rt.search(SearchRequest.decode(body, 100, rt.schema.ranges))).json_bytes())
            del got["took_ms"]
            out.append(got)
        return out

    return asyncio.run(run())
