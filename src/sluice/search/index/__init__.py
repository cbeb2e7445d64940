"""The per-shard index: Xapian documents, the query language, and BM25 with global statistics."""
