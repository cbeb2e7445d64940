from __future__ import annotations

import pytest

from sluice.search.errors import QuerySyntaxError
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.query_syntax import MAX_CLAUSES, MAX_QUERY_CHARS, parse_query
from sluice.search.index.query_tree import ResolvedQuery, cache_key, check_tree, resolve, resolve_query, terms_of


@pytest.mark.parametrize(
    "query,position,words",
    [
        ("", 0, "empty"),
        ("(a", 0, "unmatched '('"),
        ("a)", 1, "unmatched ')'"),
        ('a "b c', 2, "unterminated"),
        ("a AND", 2, "AND needs"),
        ("OR b", 0, "expected"),
        ("()", 1, "empty parentheses"),
        ("title:(a)", 6, "field"),
        ("a + ", 2, None),
    ],
)
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
    assert tree == [
        "and_not",
        [
            ["and_maybe", [["term", "XTITLE:dog"], ["or", [["term", "run"], ["term", "python"]]]]],
            ["phrase", ["e", "mail", "list"]],
        ],
    ]
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

    from sluice.search.index.analyzer import Analyzer
    from tests import corpus

    a = Analyzer()
    words = {"I", "a", "Running", "NETWORKS", "x" * 60, "generously", "cats"}
    for d in corpus.documents(500):
        words.update(re.findall(r"[A-Za-z]+", d.get("title", "") + " " + d.get("body", "")))
    assert all(a._index_query(w) == a._generated(w) for w in words)
    assert a._index_query("e-mail") == a._generated("e-mail") == ["e", "mail"]


@pytest.mark.parametrize(
    "query,position,words",
    [
        ("*", 0, "needs a word"),
        ("pa*ck", 2, "only at the end"),
        ("a**", 1, "only at the end"),
        ('"packag* manager"', 7, "inside a phrase"),
        ("e-mai*", 0, "one word"),
        ("title:*", 6, "needs a word"),
        ("python (pack*", 7, "unmatched"),
    ],
)
def test_a_misplaced_wildcard_is_a_syntax_error_at_its_position(query, position, words):
    with pytest.raises(QuerySyntaxError) as exc:
        parse_query(query)
    assert exc.value.position == position and words in str(exc.value)


def test_a_trailing_wildcard_resolves_to_its_unstemmed_prefix():
    from sluice.search.index.query_tree import expand, resolve_query, wildcards_of

    a = Analyzer()
    text = 'python AND (packag* OR "package manager") -title:library +body:tool Pythones* title:Pack*'
    q = resolve_query(text, a)
    assert wildcards_of(q.tree) == ["XTITLE:pack", "packag", "pythones"]  # lower-cased, never stemmed
    assert q.wildcards == {
        "packag": text.index("packag*"),
        "pythones": text.index("Pythones*"),
        "XTITLE:pack": text.index("title:Pack*"),
    }
    assert "pythones" not in terms_of(q.tree) and "python" in terms_of(q.tree)
    # expansion: the union in place of each wildcard; one with no terms matches nothing, as a
    # word without terms does (dropped from an OR; an AND or a required clause with it: nothing)
    assert expand(["or", [["term", "a"], ["wildcard", "x"]]], {"x": []}) == ["term", "a"]
    assert expand(["or", [["term", "a"], ["wildcard", "x"]]], {"x": ["xa", "xb"]}) == [
        "or",
        [["term", "a"], ["term", "xa"], ["term", "xb"]],
    ]
    assert expand(["and", [["term", "a"], ["wildcard", "x"]]], {"x": []}) is None
    assert expand(["and_not", [["term", "a"], ["wildcard", "x"]]], {"x": []}) == ["term", "a"]
    assert expand(["and_maybe", [["wildcard", "x"], ["term", "a"]]], {"x": []}) is None
    with pytest.raises(QuerySyntaxError):
        check_tree(["wildcard", "x"])  # shards are sent expanded trees only


def test_an_index_expands_a_prefix_to_its_terms_as_xapian_does():
    import xapian

    from sluice.search.index.shard_index import ShardIndex

    idx = ShardIndex(None)
    docs = [("1", "package packages packaging"), ("2", "packer python"), ("3", "pythonic pack")]
    for seq, (i, text) in enumerate(docs, 1):
        idx.apply(seq, [{"op": "upsert", "id": i, "fields": {"title": text}}])
    assert idx.expand("pack") == {"pack": 1, "packag": 1, "packer": 1}  # the index holds stems
    assert idx.expand("pythones") == {} and idx.expand("XTITLE:pyth") == {"XTITLE:python": 2}
    assert len(idx.expand("p", limit=2)) == 3  # limit + 1 tells "more than the limit"
    wild = xapian.Query(xapian.Query.OP_WILDCARD, "pack", 0, xapian.Query.WILDCARD_LIMIT_ERROR, xapian.Query.OP_OR)
    enquire = xapian.Enquire(idx.db)
    enquire.set_query(wild)
    assert {m.docid for m in enquire.get_mset(0, 10)} == {1, 2, 3}


def test_plain_words_parse_and_resolve_as_the_grammar_does():
    """parse_query and resolve_query answer a query of plain words without the lexer's loop and
    the grammar's descent (query_syntax.plain_words): the same tree, the same errors."""
    from sluice.search.index.query_syntax import _Parser, plain_words
    from sluice.search.index.query_tree import _resolve

    a = Analyzer()
    many = " ".join(f"w{i}" for i in range(MAX_CLAUSES))
    queries = [
        "python",
        "  command line utility\tto manage python packages  ",
        "e.mail e/mail Running images ... ÉCOLE naïve 日本語",
        "a\u00a0b\u2003c\x1cd\u3000e",  # whitespace as str.isspace sees it
        "python AND java",
        "python OR",
        "NOT python",
        "and or not",
        'c++ e-mail title:x (a) "q" py*',
        many,
        many + " one_more",
        "",
        " \t ",
    ]
    for q in queries:
        try:
            slow = _Parser(q).parse()
        except QuerySyntaxError as e:
            slow = e
        try:
            fast = parse_query(q)
        except QuerySyntaxError as e:
            fast = e
        if isinstance(slow, QuerySyntaxError):
            assert isinstance(fast, QuerySyntaxError) and fast.args == slow.args, q
            continue
        assert fast == slow, q
        wildcards: dict[str, int] = {}
        assert resolve_query(q, a) == ResolvedQuery(_resolve(slow, a, wildcards), wildcards), q
    assert plain_words(many) is not None and plain_words(many + " one_more") is None
    assert plain_words("python AND java") is None and plain_words("c++") is None
