"""Text → Xapian terms, the same way for documents and queries.

Every word is lower-cased and stemmed (English Snowball, `STEM_ALL`: only stemmed terms, with
positions, so phrases match on stems as bare words do). A field's terms carry the prefix
`X<NAME>:` (the colon keeps `a1`+`bc` apart from `a`+`1bc`); the default fields are indexed a
second time without a prefix. A query's words go through the very same TermGenerator
(`query_terms`), so the tokenizer's rules (apostrophes, hyphens, CJK) are never re-implemented;
the one shortcut is a plain ASCII word, whose term is its stem (a test holds it to the
TermGenerator's answer).
"""

from __future__ import annotations

import json
import re

import xapian

from sluice.search.index.filters import document_filter_terms
from sluice.search.index.schema import Schema, SourceDocument

ID_PREFIX = "Q"
ID_SLOT = 0  # the id as a value: the tie-break of equal scores (merge.py), the same on every shard
VECTOR_SLOT = 1  # the document's dense vector, float32 bytes (dense/vectors.py), committed with it
LANGUAGE = "english"
QUERY_TERMS_KEPT = 100_000
_PLAIN_WORD = re.compile(r"[A-Za-z]{1,60}")  # well under the TermGenerator's word length limit (64)


def field_prefix(name: str) -> str:
    return f"X{name.upper()}:"


def id_term(doc_id: str) -> str:
    return ID_PREFIX + doc_id


def _generator() -> xapian.TermGenerator:
    tg = xapian.TermGenerator()
    tg.set_stemmer(xapian.Stem(LANGUAGE))
    tg.set_stemming_strategy(xapian.TermGenerator.STEM_ALL)
    return tg


class Analyzer:
    """Owns one TermGenerator (not thread-safe: one Analyzer per thread or behind a lock)."""

    def __init__(self, schema: Schema | None = None):
        self.schema = schema or Schema()
        self._tg = _generator()
        self._stem = xapian.Stem(LANGUAGE)
        self._query_terms: dict[str, tuple[str, ...]] = {}

    def document(self, src: SourceDocument) -> xapian.Document:
        doc = xapian.Document()
        tg = self._tg
        tg.set_document(doc)
        for name, value in src.fields.items():
            if isinstance(value, str) and self.schema.is_indexed(name):
                tg.index_text(value, 1, field_prefix(name))
                tg.increase_termpos()  # a phrase never spans two fields
        for name in self.schema.default_fields:
            value = src.fields.get(name)
            if isinstance(value, str):
                tg.index_text(value)
                tg.increase_termpos()
        self.schema.check_ranges(src.fields)
        found = document_filter_terms(src.fields, self.schema.ranges)
        for term in found.terms:
            doc.add_boolean_term(term)
        for slot, value in found.values.items():
            doc.add_value(slot, value)
        doc.add_boolean_term(id_term(src.doc_id))
        doc.add_value(ID_SLOT, src.doc_id)
        stored = {k: v for k, v in src.fields.items() if self.schema.is_stored(k)}
        doc.set_data(json.dumps({"id": src.doc_id, "fields": stored}, separators=(",", ":")))
        return doc

    def query_terms(self, text: str) -> list[str]:
        """The terms, in order, that indexing `text` would produce (without a field prefix).
        Remembered per text (up to QUERY_TERMS_KEPT, then started afresh): through Xapian's
        Python bindings one word costs ~35 µs, on the router's path of every query, and query
        words repeat (Zipf)."""
        got = self._query_terms.get(text)
        if got is None:
            if len(self._query_terms) >= QUERY_TERMS_KEPT:
                self._query_terms.clear()
            got = self._query_terms[text] = tuple(self._index_query(text))
        return list(got)

    def _index_query(self, text: str) -> list[str]:
        if _PLAIN_WORD.fullmatch(text):
            # one ASCII word: the TermGenerator's term is its stem, ~1 µs instead of ~35 (a test
            # compares the two on the corpus's vocabulary); anything else goes through it
            return [self._stem(text.lower()).decode()]
        return self._generated(text)

    def _generated(self, text: str) -> list[str]:
        doc = xapian.Document()
        self._tg.set_document(doc)
        self._tg.index_text(text)
        at: list[tuple[int, str]] = []
        for item in doc.termlist():
            term = item.term.decode()
            at.extend((pos, term) for pos in item.positer)
        return [t for _, t in sorted(at)]
