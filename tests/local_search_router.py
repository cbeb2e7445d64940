"""A search router in this process with local reads over 2 shards whose indexes a Replica wrote
here (entry 1 holds every document): the query path of `sluice search serve`'s embedded default
without its processes and sockets. For tests and benches that look at that path itself
(tests/unit/search/test_query_garbage.py, bench/search/search_gc.py)."""

from __future__ import annotations

from pathlib import Path

from sluice.search.index.schema import parse_document
from sluice.search.router.config import parse_config
from sluice.search.router.runtime import RouterRuntime
from sluice.search.shard.replica import Replica

CONFIG = (
    '[search]\nlocal_reads = true\nvectors = false\n[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n'
    '[[shards]]\nname = "b"\nreplicas = ["127.0.0.1:10"]\n'
)


def local_router(docs: list, data: Path) -> RouterRuntime:
    """The router (its result cache on, global statistics) over `docs`, its indexes under `data`.
    Its replica URLs name a closed port: every query is answered by the local readers."""
    dirs = {i: data / n / "index" for i, n in enumerate("ab")}
    rt = RouterRuntime(parse_config(CONFIG), [["http://127.0.0.1:9"], ["http://127.0.0.1:10"]], local_dirs=dirs)
    for i, s in enumerate(rt.topo.shards):
        ops = [
            {"op": "upsert", "id": d.doc_id, "fields": d.fields}
            for d in map(parse_document, docs)
            if rt.topo.shard_for(d) == i
        ]
        Replica(data / s.name, fsync=False).append(1, ops)
        s.head_seq = 1
    return rt
