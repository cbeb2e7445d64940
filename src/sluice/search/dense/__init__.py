"""Dense retrieval, search's own (docs/SEARCH.md "Hybrid retrieval"): the embedding model
(embedder.py, at the router), the vectors on the wire and in the write log (vectors.py), each
shard's vector index next to its text index (vector_index.py) and the fusion of the two
rankings (fusion.py). Serving never sees a vector: only the search API's hits."""
