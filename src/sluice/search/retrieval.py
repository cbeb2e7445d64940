"""How a search ranks: lexical (BM25 over the text index), dense (cosine over the vector index)
or hybrid (both, fused), and the hybrid options — the request fields `mode` and `hybrid`,
decoded here for the contract (contract.py).

    "mode": "lexical" | "dense" | "hybrid"            (default "lexical")
    "hybrid": {"fusion": "rrf" | "weighted",           (default "rrf", k = 60)
               "rrf_k": 60, "dense_weight": 0.5,       (0–1: the dense ranking's share)
               "window": 50}                           (each ranking's depth fused; ≥ top_k)

router/query/fusion.py says what each fusion computes.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from sluice.search.errors import SearchError, SearchErrorKind

RRF_K = 60  # Elasticsearch's rrf retriever's rank_constant
DEFAULT_WINDOW = 50
MAX_WINDOW = 1000
HYBRID_FIELDS = frozenset({"fusion", "rrf_k", "dense_weight", "window"})


class RetrievalMode(str, enum.Enum):
    LEXICAL = "lexical"
    DENSE = "dense"
    HYBRID = "hybrid"


class Fusion(str, enum.Enum):
    RRF = "rrf"
    WEIGHTED = "weighted"


class VectorSearch(str, enum.Enum):
    """How shards search their vectors (search.toml's `vector_search`)."""

    AUTO = "auto"  # exact on a shard of at most 20,000 vectors, approximate above
    EXACT = "exact"  # brute force: the N-shard answer is one index's
    APPROXIMATE = "approximate"  # HNSW

    @property
    def exact(self) -> bool | None:
        return {VectorSearch.AUTO: None, VectorSearch.EXACT: True, VectorSearch.APPROXIMATE: False}[self]


def _invalid(message: str) -> SearchError:
    return SearchError(SearchErrorKind.INVALID_REQUEST, message)


@dataclasses.dataclass(frozen=True, slots=True)
class HybridOptions:
    fusion: Fusion = Fusion.RRF
    rrf_k: int = RRF_K
    dense_weight: float = 0.5
    window: int = DEFAULT_WINDOW

    def key(self) -> tuple[Any, ...]:
        return (self.fusion.value, self.rrf_k, self.dense_weight, self.window)

    @classmethod
    def decode(cls, data: Any, top_k: int) -> HybridOptions:
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise _invalid("hybrid must be an object")
        extra = sorted(set(data) - HYBRID_FIELDS)
        if extra:
            raise _invalid(f"hybrid: extra fields not permitted: {', '.join(repr(k[:40]) for k in extra[:5])}")
        try:
            fusion = Fusion(data.get("fusion", Fusion.RRF.value))
        except ValueError:
            raise _invalid("hybrid.fusion: one of rrf, weighted") from None
        rrf_k = data.get("rrf_k", RRF_K)
        if type(rrf_k) is not int or not 1 <= rrf_k <= 10_000:
            raise _invalid("hybrid.rrf_k: an integer from 1 to 10000")
        weight = data.get("dense_weight", 0.5)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight <= 1:
            raise _invalid("hybrid.dense_weight: a number from 0 to 1")
        window = data.get("window", max(DEFAULT_WINDOW, top_k))
        if type(window) is not int or not max(1, top_k) <= window <= MAX_WINDOW:
            raise _invalid(f"hybrid.window: an integer from top_k ({top_k}) to {MAX_WINDOW}")
        return cls(fusion, rrf_k, float(weight), window)


def decode_mode(value: Any) -> RetrievalMode:
    try:
        return RetrievalMode(value)
    except (ValueError, TypeError):
        raise _invalid("mode: one of lexical, dense, hybrid") from None
