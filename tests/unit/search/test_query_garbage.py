"""A query leaves no cyclic garbage in the router: everything it makes is freed by reference
counting as it ends. Garbage in cycles (a closure that calls itself is one) waits for the cyclic
collector, whose passes over everything young cost the router ~20 µs a query under load before
the query path was cleared of it (docs/BENCHMARKS.md "The collector's share")."""

from __future__ import annotations

import asyncio
import gc
import json

from sluice.search.contract import SearchRequest
from tests import corpus
from tests.local_search_router import local_router

QUERIES = [
    "python library",
    '"web server" OR http',
    "title:editor NOT emacs",
    "+debug symbols -python",
    "graph*",
    "python library",  # the result cache's answer
]


def test_searches_leave_no_cyclic_garbage(tmp_path):
    rt = local_router(corpus.documents(300), tmp_path)

    async def run(queries: list[str]) -> list[bytes]:
        out = []
        for q in queries:
            body = json.dumps({"query": q}).encode()
            req = SearchRequest.decode(body, rt.cfg.search.max_top_k, rt.schema.ranges)
            out.append((await rt.search(req)).json_bytes())
        return out

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run(["warm up"] + QUERIES))  # first uses build what stays (caches, readers)
        rt.cache.__init__(rt.cache.capacity)
        rt.searcher._trees.clear()
        gc.collect()
        gc.disable()
        try:
            answers = loop.run_until_complete(run(QUERIES * 3))
            assert gc.collect() == 0
        finally:
            gc.enable()
    finally:
        loop.close()
        rt.local_reads.close()
    assert all(b'"hits":[{' in a for a in answers), answers
    assert rt.local_reads.answered > 0 and rt.cache.hits > 0
