"""sluice search: a distributed full-text search service (docs/SEARCH.md).

    service.py, contract.py  ── the operations (SearchService, ShardService) and their typed
                                messages, bounds written once; errors.py: SearchErrorKind
    router (router/)  ── HTTP API, sharding, replica choice, failover, hedging, exact merge, cache
      │  rounds per query: term statistics from every shard, then each shard's top-k
      ▼  scored with the summed (global) statistics
    shard replica (shard/)  ── one process: a per-shard write log (fsync) applied in order to
      │                        a Xapian database; catch-up from a peer's log
      ▼
    tiers (tiers/)  ── hot (in-memory index), warm (disk), cold (S3 archives fetched on first query)
    index (index/)  ── Xapian: documents → terms, the query language, BM25 with supplied
                        collection statistics (exact cross-shard scores)

The package is its own tower: it imports sluice.observability and the shared leaves, never
serving; serving never imports it.
"""
