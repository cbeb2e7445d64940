"""A hit's snippet: the passage of its text where the query matched, through Xapian's own
`MSet::snippet`, with the matched words marked `<b>…</b>` and the rest HTML-escaped.

The index holds stems only (the analyzer's STEM_ALL), and `MSet::snippet` marks a word when
its lower-cased form or `Z` + its stem is a query term — so a snippet is taken from an MSet
whose query is the OR of `Z` + each of the query's stems (field prefixes stripped: a snippet
shows the text, not the field): then `Packages` is marked for the term `packag`. That query is
never run against the index (`get_mset(0, 0)`); Xapian only uses it to pick the passage with
the most matched words and to mark them. Without Xapian's background model
(`SNIPPET_BACKGROUND_MODEL` weighs words by the database's own frequencies), so a shard picks
the passage one index holding every document would: the snippets merge exactly, as the scores
do (tests/system/search/test_exact_merge.py).

`chars` bounds the snippet's text: its characters, counting an escape such as `&amp;` as the
one character it stands for and not counting the marks. Xapian aims at a number of bytes
(at least the number of characters) and may overshoot by a word, so the result is cut to the
bound here (`bounded`) — never in the middle of a mark or an escape. Text with no matched word
(a dense hit, a wildcard that matched a field not shown) is the text's beginning.
"""

from __future__ import annotations

import html
import re

import xapian

from sluice.search.index.analyzer import LANGUAGE
from sluice.search.index.hits import Hit
from sluice.search.index.query_tree import Tree, terms_of

MARK_START, MARK_END, OMIT = "<b>", "</b>", "…"
MAX_SNIPPET_CHARS = 2000
_FLAGS = xapian.MSet.SNIPPET_EXHAUSTIVE  # no background model: it weighs words by the shard's own frequencies
_FIELD_PREFIX = re.compile(r"^X[A-Z0-9_]+:")


def highlight_terms(tree: Tree | None) -> list[str]:
    """The `Z`-stems a snippet marks: every term of the tree, without its field prefix."""
    return sorted({"Z" + _FIELD_PREFIX.sub("", t) for t in terms_of(tree)})


class Snippets:
    """The snippets of one search's hits (one per search: it holds that query's MSet)."""

    def __init__(self, db: xapian.Database, tree: Tree | None):
        terms = highlight_terms(tree)
        self._stem = xapian.Stem(LANGUAGE)
        self._mset = None
        if terms:
            enquire = xapian.Enquire(db)
            enquire.set_query(xapian.Query(xapian.Query.OP_OR, terms))
            self._mset = enquire.get_mset(0, 0)

    def of(self, text: str, chars: int) -> str:
        if chars <= 0 or not text:
            return ""
        if self._mset is not None:
            got = self._mset.snippet(text, chars, self._stem, _FLAGS, MARK_START, MARK_END, OMIT).decode()
            if MARK_START in got:
                return bounded(got, chars)
        return leading(text, chars)


class SnippetMaker:
    """Snippets for hits found elsewhere: the router's, for the merged hits only (a shard would
    make one for each of its top-k, most of which the merge drops). A snippet needs no index
    (no background model: the module's docstring), so an empty in-memory database serves."""

    def __init__(self, snippet_fields: tuple[str, ...]):
        self._db = xapian.WritableDatabase("", xapian.DB_BACKEND_INMEMORY)
        self.snippet_fields = snippet_fields

    def add(self, hits: list[Hit], tree: Tree | None, chars: int) -> list[Hit]:
        if chars <= 0 or not hits:
            return hits
        snippets = Snippets(self._db, tree)
        return [
            Hit(h.doc_id, h.score, h.stored, snippets.of(snippet_text(h.fields, self.snippet_fields), chars))
            for h in hits
        ]


def leading(text: str, chars: int) -> str:
    """The text's first `chars` characters (cut at a space when one is near), escaped."""
    if len(text) <= chars:
        return html.escape(text, quote=False)
    cut = text[: max(0, chars - len(OMIT))]
    space = cut.rfind(" ")
    if space > len(cut) // 2:
        cut = cut[:space]
    return html.escape(cut.rstrip(), quote=False) + OMIT


# What a snippet holds besides plain text: the marks, and the escapes html.escape and Xapian
# write (every `&` of the text is escaped, so an escape never overlaps another), each with the
# characters it adds to the visible one it stands for (a mark stands for none)
_ESCAPES = (("&amp;", 4), ("&lt;", 3), ("&gt;", 3), ("&quot;", 5), ("&#39;", 4), ("&#x27;", 5))
# a mark, an escape, a run of plain text, or a lone `<` or `&` (not Xapian's: counted as one)
_TOKEN = re.compile(r"<b>|</b>|&(?:amp|lt|gt|quot|#39|#x27);|[^<&]+|.", re.S)


def visible_length(snippet: str) -> int:
    """The characters a reader sees: marks not counted, an escape counted as one. Counted with
    str.count, not piece by piece (a 300-character snippet: ~1 µs against ~25 µs)."""
    n = len(snippet) - snippet.count(MARK_START) * len(MARK_START) - snippet.count(MARK_END) * len(MARK_END)
    if "&" in snippet:
        n -= sum(snippet.count(escape) * extra for escape, extra in _ESCAPES)
    return n


def bounded(snippet: str, chars: int) -> str:
    """`snippet` cut to `chars` visible characters (the last one an ellipsis when cut), whole
    escapes only, every opened mark closed. Runs of plain text are cut by slicing."""
    if visible_length(snippet) <= chars:
        return snippet
    room = chars - len(OMIT)
    out: list[str] = []
    seen, open_mark = 0, False
    for piece in _TOKEN.findall(snippet):
        if piece == MARK_START or piece == MARK_END:
            open_mark = piece == MARK_START
            out.append(piece)
            continue
        if seen >= room:
            break
        if piece[0] in "<&":  # an escape or a lone character: one visible character
            out.append(piece)
            seen += 1
            continue
        take = piece[: room - seen]
        out.append(take)
        seen += len(take)
        if len(take) < len(piece):
            break  # the next character would not fit
    if open_mark:
        out.append(MARK_END)
    return "".join(out) + OMIT


def snippet_text(fields: dict[str, object], snippet_fields: tuple[str, ...]) -> str:
    """The text a hit's snippet is taken from: its snippet fields' strings, in order."""
    return "\n".join(v for name in snippet_fields if isinstance(v := fields.get(name), str) and v)
