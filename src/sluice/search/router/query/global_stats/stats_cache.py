"""Term statistics remembered per shard and per write-log entry: phase 1 only for what is new.

A shard's statistics (its document count, total length, and each term's document frequency)
change only when it applies a write-log entry, and every answer of a replica names the entry it
had applied (`applied_seq`). So statistics are kept per shard under that entry, and they are
exact for any later query while the shard's newest acknowledged entry (its `head_seq`, the
router's view) is still that one. A query then asks a shard for statistics only when its entry
moved (all of the query's terms) or when some of its terms were never asked at that entry (just
those); a shard whose answer is complete from memory is not asked at all. A repeated term — most
of a real query mix (Zipf) — costs no round trip, and a write to one shard forgets only that
shard's statistics (the others stay exact: their entry did not move).

Stored only when the replica's entry equals the head (a lagging replica's older statistics
would otherwise pass for the head's); each shard keeps at most `max_terms` terms, least
recently used dropped first.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from sluice.search.index.bm25 import CollectionStats

MAX_TERMS_PER_SHARD = 100_000


@dataclasses.dataclass(slots=True)
class _ShardTerms:
    seq: int
    doc_count: int
    total_length: int
    freqs: OrderedDict[str, int] = dataclasses.field(default_factory=OrderedDict)


class StatsCache:
    def __init__(self, max_terms: int = MAX_TERMS_PER_SHARD) -> None:
        self.max_terms = max_terms
        self._shards: dict[int, _ShardTerms] = {}
        self.hits = 0  # shard lookups answered from memory (no phase 1 request to that shard)
        self.misses = 0

    def lookup(
        self, shard: int, head_seq: int, terms: list[str], count: bool = True
    ) -> tuple[CollectionStats | None, list[str]]:
        """What is known of this shard at entry `head_seq` — its counts and the known terms'
        frequencies, or None when its entry moved — and the terms it must be asked about (every
        term when its entry moved; none when the cache answers the whole query)."""
        entry = self._shards.get(shard)
        if entry is None or entry.seq != head_seq:
            self.misses += count
            return None, list(terms)
        freqs = entry.freqs
        known, unknown = {}, []
        for t in terms:
            f = freqs.get(t)
            if f is None:
                unknown.append(t)
            else:
                known[t] = f
                freqs.move_to_end(t)
        if unknown:
            self.misses += count
        else:
            self.hits += count
        return CollectionStats(entry.doc_count, entry.total_length, known), unknown

    def store(self, shard: int, head_seq: int, applied_seq: int, stats: CollectionStats) -> bool:
        """Remember a replica's answer for this shard; False (nothing kept) when the replica's
        entry is not the head, whose statistics these would then not be."""
        if applied_seq != head_seq:
            return False
        entry = self._shards.get(shard)
        if (
            entry is None
            or entry.seq != applied_seq
            or (entry.doc_count, entry.total_length) != (stats.doc_count, stats.total_length)
        ):
            entry = self._shards[shard] = _ShardTerms(applied_seq, stats.doc_count, stats.total_length)
        freqs = entry.freqs
        for t, f in stats.term_freqs.items():
            freqs[t] = f
            freqs.move_to_end(t)
        while len(freqs) > self.max_terms:
            freqs.popitem(last=False)
        return True

    def forget(self, shard: int) -> None:
        self._shards.pop(shard, None)

    def __len__(self) -> int:
        return sum(len(e.freqs) for e in self._shards.values())
