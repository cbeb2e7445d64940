"""Text → dense vectors, with an embedding model that ships inside a package: wordllama
0.4.0.post1's 256-dimension static token embeddings (`l2_supercat_256`, trained from Llama 2's;
the weights and the tokenizer are files inside the wheel, MIT).

`WordLlama.load()` would try to download the tokenizer; pointed at the installed package's own
folder with downloads disabled it loads from there, so nothing is fetched at run time (tested
with the network off). Loading takes ~0.3 s and ~20 MB; embedding a short text ~0.1 ms on
one core. Vectors are L2-normalized, so a dot product is the cosine similarity the vector
index ranks by (vector_index.py).

The router embeds: each document once at ingest (its vector travels in the write log, so every
replica, snapshot and cold archive holds the same bytes) and each query once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from sluice.search.dense import vectors
from sluice.search.dense.vectors import DIM

MODEL_DIM = DIM
QUERY_VECTORS_KEPT = 10_000


class Embedder:
    def __init__(self) -> None:
        import wordllama
        from wordllama import WordLlama

        folder = os.path.dirname(wordllama.__file__)
        self._model = WordLlama.load(config="l2_supercat", dim=MODEL_DIM, cache_dir=folder, disable_download=True)
        self._lock = threading.Lock()  # the tokenizer is shared; ingest embeds from a worker thread
        self._queries: dict[str, np.ndarray] = {}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), DIM) float32, each row of norm 1 (an empty text: zeros)."""
        if not texts:
            return np.zeros((0, DIM), dtype=np.float32)
        with self._lock:
            out = self._model.embed(list(texts), norm=True)
        return np.nan_to_num(np.asarray(out, dtype=np.float32).reshape(len(texts), DIM))

    def query(self, text: str) -> np.ndarray:
        """One query's vector, remembered (queries repeat)."""
        got = self._queries.get(text)
        if got is None:
            if len(self._queries) >= QUERY_VECTORS_KEPT:
                self._queries.clear()
            got = self._queries[text] = self.embed([text])[0]
        return got


def document_text(fields: dict[str, object], default_fields: Sequence[str]) -> str:
    """What a document's vector is of: its default fields' strings (title and body), in order."""
    return "\n".join(v for name in default_fields if isinstance(v := fields.get(name), str) and v)


def attach_vectors(batches: dict[int, list[dict[str, Any]]], embedder: Embedder, default_fields: Sequence[str]) -> None:
    """Give every upsert of a bulk write its vector (`"vector"`: base64, vectors.py), in one
    batch: it is logged, replicated and applied with the document."""
    ops = [op for ops in batches.values() for op in ops if op.get("op") == "upsert"]
    if not ops:
        return
    found = embedder.embed([document_text(op.get("fields", {}), default_fields) for op in ops])
    for op, vector in zip(ops, found):
        op["vector"] = vectors.encode(vector)
