"""One shard's Xapian database: apply ordered write batches, report statistics, search.

The sequence number of the last applied write-log entry is stored in the database's metadata
and committed in the same transaction as the documents, so after a crash the database says
exactly which log entries to replay (shard/replica.py) — no entry is applied twice or skipped.
Not thread-safe: the shard server calls it from one thread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import xapian

from sluice.search.dense import vectors
from sluice.search.dense.vector_index import VectorIndex
from sluice.search.index.analyzer import VECTOR_SLOT, Analyzer, id_term
from sluice.search.index.bm25 import (
    Bm25Params,
    CollectionStats,
    ShardWeighting,
    global_weighting,
    leaf_part,
    leaf_weight,
    local_weighting,
)
from sluice.search.index.filters import Clause, filtered
from sluice.search.index.hits import Hit, merge, stored_hit
from sluice.search.index.query_builder import build_query
from sluice.search.index.query_tree import Tree, terms_of
from sluice.search.index.ranking import top_mset
from sluice.search.index.schema import Schema, check_id, parse_document
from sluice.search.index.snippets import Snippets, snippet_text

APPLIED_KEY = "sluice.applied_seq"
APPLIED_TS_KEY = "sluice.applied_ts"  # when the applied entry was sequenced (the router's clock)
MAX_WILDCARD_TERMS = 100  # terms one wildcard may expand to (the union over every shard)


def vectors_of(db: xapian.Database) -> VectorIndex:
    """The vector index of every document with a vector (their value slot)."""
    index = VectorIndex()
    index.add_many((item.docid, vectors.from_bytes(item.value)) for item in db.valuestream(VECTOR_SLOT))
    return index


class ShardIndex:
    def __init__(self, path: Path | None, schema: Schema | None = None, params: Bm25Params | None = None):
        """`path` None: an in-memory database (the hot tier, tests, the library-alone benchmark)."""
        self.path = path
        if path is None:
            self.db = xapian.WritableDatabase("", xapian.DB_BACKEND_INMEMORY)
        else:
            path.mkdir(parents=True, exist_ok=True)
            self.db = xapian.WritableDatabase(str(path), xapian.DB_CREATE_OR_OPEN)
        self.analyzer = Analyzer(schema)
        self.snippet_fields = self.analyzer.schema.snippet_fields
        self.params = params or Bm25Params()
        self.last_matches = 0  # of the last search (the simulated cost: shard/replica.py)
        self.vectors = vectors_of(self.db)

    @classmethod
    def read_only(
        cls, db: xapian.Database, schema: Schema | None = None, params: Bm25Params | None = None, vectors: bool = True
    ) -> ShardIndex:
        """An index over an opened read-only database (the cold tier's archives, the router's
        local reads); apply() fails. `vectors` False: the caller reads them when it needs them."""
        self = cls.__new__(cls)
        self.path, self.last_matches = None, 0
        self.db, self.analyzer, self.params = db, Analyzer(schema), params or Bm25Params()
        self.snippet_fields = self.analyzer.schema.snippet_fields
        self.vectors = vectors_of(db) if vectors else VectorIndex()
        return self

    @property
    def applied_seq(self) -> int:
        raw = self.db.get_metadata(APPLIED_KEY)
        return int(raw) if raw else 0

    @property
    def applied_ts(self) -> float:
        """When the newest applied entry was sequenced (0: never, or before this was kept)."""
        raw = self.db.get_metadata(APPLIED_TS_KEY)
        return float(raw) if raw else 0.0

    def apply(self, seq: int, ops: list[dict[str, Any]], ts: float | None = None) -> None:
        """Apply one log entry's operations and commit them with its sequence number (and the
        time it was sequenced: the index's freshness survives a restart)."""
        for op in ops:
            kind = op.get("op")
            if kind == "upsert":
                src = parse_document({"id": op["id"], **op.get("fields", {})})
                doc = self.analyzer.document(src)
                vector = None if op.get("vector") is None else vectors.decode(op["vector"])
                if vector is not None:
                    doc.add_value(VECTOR_SLOT, vectors.to_bytes(vector))
                docid = self.db.replace_document(id_term(src.doc_id), doc)
                if vector is None:
                    self.vectors.remove(docid)
                else:
                    self.vectors.add(docid, vector)
            elif kind == "delete":
                check_id(str(op["id"]))
                for posting in self.db.postlist(id_term(str(op["id"]))):
                    self.vectors.remove(posting.docid)
                self.db.delete_document(id_term(str(op["id"])))
            # an unknown op was refused when it was logged; nothing else to do here
        self.db.set_metadata(APPLIED_KEY, str(seq))
        if ts:
            self.db.set_metadata(APPLIED_TS_KEY, repr(float(ts)))
        self.db.commit()

    def stats(self, terms: list[str]) -> CollectionStats:
        db = self.db
        return CollectionStats(db.get_doccount(), db.get_total_length(), {t: db.get_termfreq(t) for t in terms})

    def expand(self, prefix: str, limit: int = MAX_WILDCARD_TERMS) -> dict[str, int]:
        """The index terms starting with `prefix` and their document frequencies — what Xapian's
        OP_WILDCARD would expand to — at most limit + 1 of them (more than `limit` tells the
        router the wildcard is too broad without listing every term)."""
        out: dict[str, int] = {}
        for item in self.db.allterms(prefix):
            out[item.term.decode()] = item.termfreq
            if len(out) > limit:
                break
        return out

    def search(
        self,
        tree: Tree | None,
        top_k: int,
        global_stats: CollectionStats | None = None,
        snippet_chars: int = 0,
        clauses: list[Clause] | None = None,
        pruned: bool = False,
    ) -> list[Hit]:
        """The top_k hits, scored with `global_stats` when given (exact across shards), else with
        this shard's own statistics; each with a snippet of at most `snippet_chars` characters;
        only documents that pass the filter `clauses` (filters.py), scored as without it; every
        match scored unless `pruned` (ranking.py)."""
        return self._search(tree, top_k, global_stats, snippet_chars, clauses, pruned)[0]

    def search_with_parts(
        self,
        tree: Tree,
        top_k: int,
        global_stats: CollectionStats,
        unknown: list[str],
        scored: dict[str, int],
        snippet_chars: int = 0,
        clauses: list[Clause] | None = None,
        pruned: bool = False,
    ) -> tuple[list[Hit], dict[str, int], list[dict[str, float]]]:
        """A one-round search (router/query/global_stats/one_round.py): `global_stats` lacks the frequencies of the
        `unknown` terms, which are scored with this shard's own in their place. Also returns this
        shard's frequency of each unknown term and, per hit, each unknown term's part of its
        score (`scored`: how many leaves of each term add weight, query_tree.scored_leaves)."""
        local = {t: self.db.get_termfreq(t) for t in unknown}
        hits, w, docids = self._search(tree, top_k, global_stats, snippet_chars, clauses, pruned)
        parts: list[dict[str, float]] = [{} for _ in hits]
        if not hits:
            return hits, local, parts
        db = self.db
        avlen = db.get_avlength()
        len_factor = 1 / avlen if avlen and w.b != 0 and w.k1 != 0 else 0.0
        by_docid = sorted(range(len(hits)), key=docids.__getitem__)
        n_local = db.get_doccount()
        for t in unknown:
            if not scored.get(t) or not local[t]:
                continue  # adds no weight here
            tw = leaf_weight(w, n_local, local[t], t) * scored[t]
            postings = db.postlist(t)
            for i in by_docid:
                did = docids[i]
                try:
                    item = postings.skip_to(did)
                except StopIteration:
                    break
                if item.docid == did:
                    parts[i][t] = leaf_part(w, tw, item.wdf, item.doclength, len_factor)
        return hits, local, parts

    def _search(
        self,
        tree: Tree | None,
        top_k: int,
        global_stats: CollectionStats | None,
        snippet_chars: int,
        clauses: list[Clause] | None,
        pruned: bool = False,
    ) -> tuple[list[Hit], ShardWeighting, list[int]]:
        """The hits, the weighting they were scored with, and their Xapian document ids."""
        if tree is None or top_k <= 0:  # top_k's bounds are the contract's (search/contract.py)
            return [], local_weighting(self.params), []
        mset, w = self._mset(tree, top_k, global_stats, clauses, pruned)
        out, docids = [], []
        snippets = Snippets(self.db, tree) if snippet_chars > 0 else None
        # the bindings' own iterator, not `for m in mset`: each of its items asks the binding
        # for six values (rank, percent, collapse key…) where a hit needs three (~3 µs a hit)
        it, end = mset._begin(), mset._end()
        while it != end:
            out.append(self._hit(it.get_document(), it.get_weight(), snippets, snippet_chars))
            docids.append(it.get_docid())
            next(it)
        return out, w, docids

    def _mset(
        self,
        tree: Tree,
        top_k: int,
        global_stats: CollectionStats | None,
        clauses: list[Clause] | None,
        pruned: bool = False,
    ) -> tuple[xapian.MSet, ShardWeighting]:
        if global_stats is None:
            w = local_weighting(self.params)
        else:
            w = global_weighting(self.params, global_stats, self.stats(terms_of(tree)))
        mset = top_mset(self.db, w, filtered(build_query(tree, w.term_factor), clauses), top_k, pruned)
        self.last_matches = mset.get_matches_estimated()
        return mset, w

    def ranked(
        self,
        tree: Tree | None,
        top_k: int,
        global_stats: CollectionStats | None,
        clauses: list[Clause] | None,
        pruned: bool = False,
    ) -> list[tuple[Hit, int]]:
        """search()'s hits without their stored fields (`stored` is ""), each with its Xapian
        document id for `fetched`: the query phase of a query-then-fetch (tiers/local_reads.py).
        A hit's id is its sort key — the id value slot every document carries (analyzer.py) and
        that ties are ordered by — so no document is read here: reading one's stored data is
        most of a hit's cost (a B-tree lookup, an 8 KiB block read and zlib inflate, ~5 µs)."""
        if tree is None or top_k <= 0:
            return []
        mset, _ = self._mset(tree, top_k, global_stats, clauses, pruned)
        out = []
        it, end = mset._begin(), mset._end()
        while it != end:
            key, score = it.get_sort_key(), it.get_weight()
            # a document without its id value (none sluice wrote has none) is read for its id
            hit = Hit(key.decode(), score, "") if key else stored_hit(it.get_document().get_data(), score)
            out.append((hit, it.get_docid()))
            next(it)
        return out

    def fetched(self, hit: Hit, docid: int) -> Hit:
        """A hit of `ranked` with its stored fields, read from the revision it was ranked at
        (the caller has not reopened the database since)."""
        if hit.stored:
            return hit  # read when ranked
        got = stored_hit(self.db.get_document(docid).get_data(), hit.score)
        if got.doc_id != hit.doc_id:  # never, unless the index was written wrongly: say so, loudly
            raise ValueError(f"document {docid} holds {got.doc_id!r}, ranked as {hit.doc_id!r}")
        return got

    def _hit(self, document: xapian.Document, score: float, snippets: Snippets | None, snippet_chars: int) -> Hit:
        hit = stored_hit(document.get_data(), score)  # the fields stay JSON text until read
        if snippets is None:
            return hit
        snippet = snippets.of(snippet_text(hit.fields, self.snippet_fields), snippet_chars)
        return Hit(hit.doc_id, score, hit.stored, snippet)

    def dense_search(
        self, vector: np.ndarray, top_k: int, exact: bool | None = None, clauses: list[Clause] | None = None
    ) -> list[Hit]:
        """The top_k documents by the cosine of their vector with `vector` (dense/vector_index.py:
        exact on a small shard unless `exact` says otherwise), ties by id; only documents that
        pass the filter `clauses`."""
        if top_k <= 0 or not len(self.vectors):
            return []
        allowed = None
        if clauses:
            enquire = xapian.Enquire(self.db)
            enquire.set_query(filtered(xapian.Query.MatchAll, clauses))
            enquire.set_weighting_scheme(xapian.BoolWeight())
            allowed = {m.docid for m in enquire.get_mset(0, self.db.get_doccount())}
        found = self.vectors.search(vector, top_k, exact, allowed)
        self.last_matches = len(found)
        hits = [self._hit(self.db.get_document(docid), score, None, 0) for docid, score in found]
        return merge([hits], top_k)

    def doc_count(self) -> int:
        return self.db.get_doccount()

    def close(self) -> None:
        self.db.close()
