"""Snippets (index/snippets.py): the passage where the query matched, matched words marked
(stems included), the text HTML-escaped, at most snippet_chars characters."""

from __future__ import annotations

import html
import random
import re

import pytest

from sluice.search.index.query_tree import resolve
from sluice.search.index.shard_index import ShardIndex
from sluice.search.index.snippets import bounded, leading, visible_length

BODY = (
    'Intro words first. The <weather> in Paris & Lyon is "mild" and rainy. '
    "Packages are managed by apt, the Debian package manager. "
) * 3


def _index(docs):
    ix = ShardIndex(None)
    ix.apply(1, [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in docs])
    return ix


def _search(ix, query, chars=300):
    return ix.search(resolve(query, ix.analyzer), 10, snippet_chars=chars)


def test_matched_words_are_marked_with_their_stems_and_the_text_escaped():
    ix = _index([{"id": "a", "title": "apt", "body": BODY}])
    [hit] = _search(ix, "managing package", 200)
    assert "<b>Packages</b>" in hit.snippet and "<b>managed</b>" in hit.snippet and "<b>manager</b>" in hit.snippet
    assert "<" not in re.sub(r"</?b>", "", hit.snippet)  # every other < escaped
    [hit] = _search(ix, "weather lyon", 200)
    assert "&lt;<b>weather</b>&gt;" in hit.snippet and "&amp;" in hit.snippet
    assert hit.fields["body"] == BODY  # the stored text is unchanged


def test_a_field_query_marks_the_word_and_the_title_is_not_the_snippet():
    ix = _index([{"id": "a", "title": "Debian tools", "body": "apt manages Debian packages"}])
    [hit] = _search(ix, "title:debian")
    assert hit.snippet == "apt manages <b>Debian</b> packages"


@pytest.mark.parametrize("chars", [1, 5, 20, 37, 80, 150])
def test_a_snippet_is_never_longer_than_asked(chars):
    rng = random.Random(chars)
    words = ["alpha", "beta", "<gamma>", "d&e", "épée", "package", "managers", '"quoted"', "x"]
    docs = [{"id": str(i), "body": " ".join(rng.choice(words) for _ in range(rng.randint(1, 120)))} for i in range(40)]
    ix = _index(docs)
    for q in ("package", "alpha gamma", "manager x", "épée"):
        for hit in _search(ix, q, chars):
            assert 0 < visible_length(hit.snippet) <= chars, (q, hit.snippet)
            assert (
                html.unescape(re.sub(r"</?b>", "", hit.snippet)).replace("…", "")
                in hit.fields["body"].replace("\n", " ")
                or "…" in hit.snippet
            )


def test_no_snippet_when_none_is_asked_and_a_text_without_matches_gives_its_beginning():
    ix = _index([{"id": "a", "body": "one two three"}])
    assert _search(ix, "two", 0)[0].snippet == ""
    assert leading("a <b> c " * 20, 12) == "a &lt;b&gt; c a…"
    assert leading("short & sweet", 50) == "short &amp; sweet"


def test_bounded_keeps_whole_escapes_and_closes_a_mark():
    s = "<b>abc</b> &amp; <b>defgh</b> tail"
    assert visible_length(s) == 16
    assert bounded(s, 16) == s
    cut = bounded(s, 8)
    assert cut == "<b>abc</b> &amp; <b>d</b>…" and visible_length(cut) == 8


_PIECE = re.compile(r"<b>|</b>|&(?:amp|lt|gt|quot|#39|#x27);|.", re.S)


def _bounded_piece_by_piece(snippet: str, chars: int) -> str:
    """The first bounded(): every visible character one regex piece (the reference)."""
    pieces = _PIECE.findall(snippet)
    if sum(1 for p in pieces if p not in ("<b>", "</b>")) <= chars:
        return snippet
    out, seen, open_mark = [], 0, False
    for piece in pieces:
        if piece in ("<b>", "</b>"):
            open_mark = piece == "<b>"
            out.append(piece)
            continue
        if seen >= chars - 1:
            break
        out.append(piece)
        seen += 1
    return "".join(out) + ("</b>" if open_mark else "") + "…"


def test_bounded_and_visible_length_equal_the_piece_by_piece_reference():
    """Counted with str.count and cut by slicing runs of text, as one piece per character would."""
    rng = random.Random(5)
    parts = ["<b>", "</b>", "&amp;", "&lt;", "&gt;", "&quot;", "&#39;", "&#x27;", "a", "bc ", "word", "é", "\n"]
    for _ in range(3000):
        s = "".join(rng.choice(parts) for _ in range(rng.randint(0, 40)))
        want = sum(1 for p in _PIECE.findall(s) if p not in ("<b>", "</b>"))
        assert visible_length(s) == want, s
        for chars in (0, 1, 2, 5, 13, 40):
            assert bounded(s, chars) == _bounded_piece_by_piece(s, chars), (s, chars)
