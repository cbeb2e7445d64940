from __future__ import annotations

import pytest

from sluice.search.errors import QuerySyntaxError
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.query_syntax import MAX_CLAUSES, MAX_QUERY_CHARS, parse_query
from sluice.search.index.query_tree import cache_key, check_tree, resolve, terms_of


@pytest.mark.parametrize("query,position,words", [
    ("", 0, "empty"), ("(a", 0, "unmatched '('"), ("a)", 1, "unmatched ')'"), ('a "b c', 2, "unterminated"),
    ("a AND", 2, "AND needs"), ("OR b", 0, "expected"), ("()", 1, "empty parentheses"),
    ("title:(a)", 6, "field"), ("a + ", 2, None),
])
def test_errors_name_the_position(query, position, words):
    if words is None:  # a lone '+' is a word, not an error
        parse_query(query)
        return
    with pytest.raises(QuerySyntaxError) as exc:
        parse_query(query)
    assert exc.value.position == position and words in str(exc.value)


def test_bounds():
    with pytest.raises(QuerySyntaxError):
        parse_query("a" * (MAX_QUERY_CHARS + 1))
    with pytest.raises(QuerySyntaxError) as exc:
        parse_query(" ".join(["w"] * (MAX_CLAUSES + 1)))
    assert "more than" in str(exc.value)


def test_resolution_stems_prefixes_and_normalizes():
    a = Analyzer()
    tree = resolve('Running +title:Dogs -"e-mail lists" python', a)
    assert tree == ["and_not", [["and_maybe", [["term", "XTITLE:dog"], ["or", [["term", "run"], ["term", "python"]]]]],
                                ["phrase", ["e", "mail", "list"]]]]
    assert terms_of(tree) == sorted(["XTITLE:dog", "run", "python", "e", "mail", "list"])
    assert cache_key(resolve("run  DOGS", a)) == cache_key(resolve("running dog", a))
    assert resolve("!!!", a) is None
    assert check_tree(tree) is tree


@pytest.mark.parametrize("bad", [[], ["nope"], ["term", 3], ["phrase", ["one"]], ["and_not", [["term", "a"]]]])
def test_malformed_trees_from_the_wire_are_refused(bad):
    with pytest.raises(QuerySyntaxError):
        check_tree(bad)


def test_a_plain_words_terms_are_the_term_generators():
    """The analyzer's shortcut for one ASCII word (its stem) gives what Xapian's TermGenerator
    gives, over the corpus's vocabulary and a few edge cases."""
    import re

    from sluice.search import corpus
    from sluice.search.index.analyzer import Analyzer

    a = Analyzer()
    words = {"I", "a", "Running", "NETWORKS", "x" * 60, "generously", "cats"}
    for d in corpus.documents(500):
        words.update(re.findall(r"[A-Za-z]+", d.get("title", "") + " " + d.get("body", "")))
    assert all(a._index_query(w) == a._generated(w) for w in words)
    assert a._index_query("e-mail") == a._generated("e-mail") == ["e", "mail"]
