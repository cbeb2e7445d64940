"""Queries answered in the router's own process from its local replicas' indexes on disk
(`local_reads = true`; the embedded default): no process hop on the query path.

Measured with 8 concurrent clients on 2 cores (docs/BENCHMARKS.md "Search throughput"): each
query's HTTP exchanges with the shard processes — a write that wakes the shard, its HTTP and
JSON, a write back that wakes the router — cost ~3× the index work they carry. A local
replica's index is a Xapian database in a folder on this machine, and Xapian lets any number
of readers in other processes open it while its one writer (the replica process) commits: so
the router opens it read-only and answers the query protocol's two requests itself, with the
same code a replica and a cold shard answer with (shard/answers.py), so scores, statistics and
snippets are the same and merge exactly. A lexical search over shards all read here is a
query then fetch (`LocalReads.top`): only the merged top_k documents are read.

Writes still go to the replica process (the write log, fsync, replication, compaction and
catch-up are unchanged). A reader is brought to the shard's newest acknowledged entry before it
answers (`reopen()`, which is cheap when nothing changed): a write is acknowledged only after a
replica committed it, so a query after an acknowledged write sees it. If the reader cannot reach
that entry (its replica lags, is being rebuilt from a snapshot, has no index yet) or Xapian
reports the revision gone under it twice, the query goes to the replicas over HTTP as before.
The dense vectors are read from the index's value slot on first dense use after each new entry.
One thread (the router's event loop) uses the readers.

The CPU the readers spend is counted (`index_cpu_s` in the status JSON: the calling thread's
CPU time around each answer, ~1 µs a call), so that a benchmark can split the router process's
CPU per query into the shards' index work and the router's own (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import xapian

from sluice.search.contract import ShardSearchAnswer, ShardSearchRequest, StatsAnswer, StatsRequest
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import Hit, merge
from sluice.search.index.schema import Schema
from sluice.search.index.shard_index import ShardIndex, vectors_of
from sluice.search.shard.answers import search_answer, stats_answer

log = logging.getLogger("sluice.search.router")
T = TypeVar("T")


class NotCurrent(Exception):
    """The local index cannot answer at the shard's newest entry: ask a replica instead."""


class LocalReader:
    def __init__(self, index_dir: Path, schema: Schema | None):
        self.dir, self.schema = index_dir, schema
        self._index: ShardIndex | None = None
        self._vectors_at = -1  # the entry the index's vectors were read at
        self._applied = 0  # the entry the open revision holds (_reopen)

    def _current(self, head_seq: int) -> ShardIndex:
        ix = self._index
        if ix is None:
            if not self.dir.exists():
                raise NotCurrent("no index yet")
            ix = self._index = ShardIndex.read_only(xapian.Database(str(self.dir)), self.schema, vectors=False)
            self._applied = ix.applied_seq
        if self._applied < head_seq:
            self._reopen(ix)
            if self._applied < head_seq:  # behind, or a replaced folder (a snapshot installed): open it anew
                applied = self._applied
                self.close()
                raise NotCurrent(f"at entry {applied}, the shard at {head_seq}")
        return ix

    def _reopen(self, ix: ShardIndex) -> None:
        """To the newest revision. The entry it holds is read here, once: a read-only database
        shows one revision until reopened, so its entry is known until then (reading it from the
        index's metadata at every answer was a B-tree lookup each, ~5 % of a query's CPU)."""
        ix.db.reopen()
        self._applied = ix.applied_seq

    def call(self, req: StatsRequest | ShardSearchRequest, head_seq: int) -> StatsAnswer | ShardSearchAnswer:
        """NotCurrent when this reader cannot answer at `head_seq`."""
        return self._read(head_seq, lambda ix: self._answer(ix, req))

    def stats(self, terms: list[str], head_seq: int) -> tuple[CollectionStats, int]:
        """The shard's statistics of `terms` and the entry they are at (a statistics answer's,
        without its request and answer objects); NotCurrent as `call`."""
        return self._read(head_seq, lambda ix: (ix.stats(terms), self._applied))

    def index(self, head_seq: int) -> ShardIndex:
        """The index at `head_seq`, to read from until this thread next asks a reader (LocalReads.top);
        NotCurrent as `call`."""
        try:
            return self._current(head_seq)
        except (xapian.DatabaseOpeningError, xapian.DatabaseCorruptError) as exc:
            self.close()
            raise NotCurrent(str(exc)) from None

    @property
    def revision(self) -> int:
        """The entry the open revision holds (-1: to be reopened)."""
        return self._applied

    def moved(self) -> None:
        """The writer reused the blocks of the revision read: reopen at the next use."""
        self._applied = -1

    def _answer(self, ix: ShardIndex, req: StatsRequest | ShardSearchRequest) -> StatsAnswer | ShardSearchAnswer:
        applied = self._applied
        if isinstance(req, StatsRequest):
            return stats_answer(ix, req, applied)
        if req.vector is not None and self._vectors_at != applied:
            ix.vectors, self._vectors_at = vectors_of(ix.db), applied
        return search_answer(ix, req, applied)

    def _read(self, head_seq: int, read: Callable[[ShardIndex], T]) -> T:
        for _ in range(2):  # once more after the writer moved the revision under this read
            try:
                return read(self._current(head_seq))
            except xapian.DatabaseModifiedError:  # the writer reused the blocks of the revision read
                self._applied = -1  # the next _current reopens and reads the entry again
            except (xapian.DatabaseOpeningError, xapian.DatabaseCorruptError) as exc:
                self.close()
                raise NotCurrent(str(exc)) from None
        raise NotCurrent("the index kept changing under the reader")

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
        self._index, self._vectors_at = None, -1


class LocalReads:
    """The readers by shard position (the shards with a local disk replica)."""

    def __init__(self, dirs: dict[int, Path], schema: Schema | None):
        self.readers = {pos: LocalReader(d, schema) for pos, d in dirs.items()}
        self.schema = schema
        # the shards' databases opened as one (union_top): its indexes and their revisions, then it
        self._union: tuple[list[ShardIndex], list[int], ShardIndex] | None = None
        self.answered = 0
        self.fell_back = 0
        self.index_cpu_ns = 0  # the thread CPU time spent inside the readers' answers

    def has(self, position: int) -> bool:
        return position in self.readers

    def call(
        self, position: int, req: StatsRequest | ShardSearchRequest, head_seq: int
    ) -> StatsAnswer | ShardSearchAnswer | None:
        """The local answer for the shard at `position`, or None when its reader cannot answer at
        `head_seq` (the query then goes to its replicas)."""
        t0 = time.thread_time_ns()
        try:
            answer = self.readers[position].call(req, head_seq)
        except NotCurrent:
            self.fell_back += 1
            return None
        finally:
            self.index_cpu_ns += time.thread_time_ns() - t0
        self.answered += 1
        return answer

    def stats(self, asked: Iterable[tuple[int, int, list[str]]]) -> list[tuple[CollectionStats, int]] | None:
        """For each (position, head_seq, terms) of `asked`, that shard's statistics of the terms
        and the entry they are at, as a statistics round's answers would say; None when a reader
        cannot answer at its shard's entry (the round then asks the replicas)."""
        t0 = time.thread_time_ns()
        out: list[tuple[CollectionStats, int]] = []
        try:
            for position, head_seq, terms in asked:
                out.append(self.readers[position].stats(terms, head_seq))
        except NotCurrent:
            self.fell_back += 1
            return None
        finally:
            self.answered += len(out)
            self.index_cpu_ns += time.thread_time_ns() - t0
        return out

    def top(self, asked: Sequence[tuple[int, int]], req: ShardSearchRequest) -> tuple[list[Hit], list[float]] | None:
        """A lexical search over the shards of `asked` (position, head_seq) as query then fetch:
        each reader ranks its top_k without reading a document (ShardIndex.ranked), the rankings
        merge as fetched hits would (hits.merge: the same order, the same reported scores), and
        only the merged top_k documents' stored fields are read, each from the index that ranked
        it, at the revision it ranked at: nothing reopens a reader within this call, and only
        this thread uses them. Also each shard's seconds (its ranking and its documents' reads).
        None when a reader cannot answer at its shard's entry (the round then asks the replicas).

        Why: reading a document's stored data is most of a hit's cost, and a search round reads
        every shard's top_k — with N shards, N−1 of every N documents read were then dropped by
        the merge (docs/SEARCH.md "Query then fetch")."""
        return self._searched(self._top, asked, req)

    def union_top(
        self, asked: Sequence[tuple[int, int]], req: ShardSearchRequest
    ) -> tuple[list[Hit], list[float]] | None:
        """A lexical search over the shards of `asked` (position, head_seq) as one index: their
        databases opened together as one Xapian Database, searched once with its own statistics
        — those of the union, so the scores are one index's holding every document, with no
        statistics round, no per-shard weighting and no merge of rankings — and only its top_k
        documents read. Also each shard's seconds (the search's time, shared by the shards' document
        counts). None when a reader cannot answer at its shard's entry (the search then goes the
        way of the statistics round).

        Why: with every shard in this process, the statistics round, N queries each built with
        its per-term corrections and their merge cost the router more than one search of the
        union (docs/SEARCH.md "One search over the local shards")."""
        return self._searched(self._union_top, asked, req)

    def _searched(
        self,
        search: Callable[[Sequence[tuple[int, int]], ShardSearchRequest], tuple[list[Hit], list[float]]],
        asked: Sequence[tuple[int, int]],
        req: ShardSearchRequest,
    ) -> tuple[list[Hit], list[float]] | None:
        """search(asked, req) over several readers at once; read again once after the writer moved
        a revision under it; None (counted as fallen back) when a reader cannot answer."""
        try:
            for _ in range(2):  # once more after the writer moved a revision under this read
                try:
                    return search(asked, req)
                except xapian.DatabaseModifiedError:
                    for position, _ in asked:
                        self.readers[position].moved()
                except (xapian.DatabaseOpeningError, xapian.DatabaseCorruptError) as exc:
                    for position, _ in asked:
                        self.readers[position].close()  # each opens again at its next use
                    raise NotCurrent(str(exc)) from None
            raise NotCurrent("the indexes kept changing under the readers")
        except NotCurrent:
            self.fell_back += 1
            return None

    def _union_top(self, asked: Sequence[tuple[int, int]], req: ShardSearchRequest) -> tuple[list[Hit], list[float]]:
        t0, t = time.thread_time_ns(), time.perf_counter()
        try:
            indexes = [self.readers[position].index(head_seq) for position, head_seq in asked]
            union = self._union_of(indexes, [self.readers[position].revision for position, _ in asked])
            hits = union.search(req.tree, req.top_k, None, 0, req.filter)
            counts = [ix.db.get_doccount() for ix in indexes]
        finally:
            self.index_cpu_ns += time.thread_time_ns() - t0
        elapsed, total = time.perf_counter() - t, sum(counts) or 1
        self.answered += len(asked)
        return merge([hits], req.top_k), [elapsed * n / total for n in counts]

    def _union_of(self, indexes: list[ShardIndex], revisions: list[int]) -> ShardIndex:
        """The indexes' databases as one, opened again when a shard's reader or revision changed
        (a reader reopens its own database in place; the union is rebuilt rather than trusted
        to follow it). One index is its own union."""
        if len(indexes) == 1:
            return indexes[0]
        got = self._union
        if (
            got is not None
            and got[1] == revisions
            and len(got[0]) == len(indexes)
            and all(a is b for a, b in zip(got[0], indexes))
        ):
            return got[2]
        db = xapian.Database()
        for ix in indexes:
            db.add_database(ix.db)
        union = ShardIndex.read_only(db, self.schema, vectors=False)
        self._union = (indexes, revisions, union)
        return union

    def _top(self, asked: Sequence[tuple[int, int]], req: ShardSearchRequest) -> tuple[list[Hit], list[float]]:
        indexes: list[ShardIndex] = []
        seconds: list[float] = []
        rankings: list[list[Hit]] = []
        where: dict[str, tuple[int, int]] = {}  # a ranked hit's id → (its index, its Xapian document id)
        t0 = time.thread_time_ns()
        try:
            for i, (position, head_seq) in enumerate(asked):
                t = time.perf_counter()
                ix = self.readers[position].index(head_seq)
                ranked = ix.ranked(req.tree, req.top_k, req.stats, req.filter, req.pruned)
                for hit, docid in ranked:
                    where[hit.doc_id] = (i, docid)
                rankings.append([hit for hit, _ in ranked])
                indexes.append(ix)
                seconds.append(time.perf_counter() - t)
        finally:
            self.index_cpu_ns += time.thread_time_ns() - t0
        merged = merge(rankings, req.top_k)  # the router's part: outside the index work counted
        out = []
        t0 = time.thread_time_ns()
        try:
            for hit in merged:
                i, docid = where[hit.doc_id]
                t = time.perf_counter()
                out.append(indexes[i].fetched(hit, docid))
                seconds[i] += time.perf_counter() - t
        finally:
            self.index_cpu_ns += time.thread_time_ns() - t0
        self.answered += len(asked)
        return out, seconds

    def status(self) -> dict[str, int | float]:
        return {"answered": self.answered, "fell_back": self.fell_back, "index_cpu_s": self.index_cpu_ns / 1e9}

    def close(self) -> None:
        self._union = None
        for r in self.readers.values():
            r.close()
