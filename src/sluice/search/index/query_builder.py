"""A query tree (query_tree.py) → a Xapian Query whose every term carries its weighting factor.

A phrase is built as FILTER(AND(scaled terms), PHRASE(terms)): Xapian weights a phrase match as
the sum of its terms' weights, which this reproduces while letting each term carry its own
factor (OP_SCALE_WEIGHT cannot sit inside OP_PHRASE).
"""

from __future__ import annotations

import xapian

from sluice.search.index.query_tree import NodeKind, Tree

Q = xapian.Query
_new_query, _init_query = xapian._xapian.new_Query, xapian._xapian.Query_swiginit


def _query(*args: object) -> xapian.Query:
    q = Q.__new__(Q)
    _init_query(q, _new_query(*args))
    return q


_BOOL = {
    NodeKind.OR: Q.OP_OR,
    NodeKind.AND: Q.OP_AND,
    NodeKind.AND_NOT: Q.OP_AND_NOT,
    NodeKind.AND_MAYBE: Q.OP_AND_MAYBE,
}


def build_query(tree: Tree | None, term_factor: dict[str, float]) -> xapian.Query:
    # module functions, not closures: a closure that calls itself is a reference cycle left to
    # the cyclic collector, and a query builds a tree per shard (query_tree.py says more)
    return Q.MatchNothing if tree is None else _build(tree, term_factor)


def _leaf(term: str, term_factor: dict[str, float]) -> xapian.Query:
    q = _query(term)
    f = term_factor.get(term)
    return q if f is None or f == 1.0 else _query(Q.OP_SCALE_WEIGHT, q, f)


def _build(t: Tree, term_factor: dict[str, float]) -> xapian.Query:
    op = t[0]
    if op == NodeKind.TERM:
        return _leaf(t[1], term_factor)
    if op == NodeKind.PHRASE:
        phrase = _query(Q.OP_PHRASE, [_query(x) for x in t[1]])
        return _query(Q.OP_FILTER, _query(Q.OP_AND, [_leaf(x, term_factor) for x in t[1]]), phrase)
    if op == NodeKind.ALL:
        return Q.MatchAll
    return _query(_BOOL[op], [_build(c, term_factor) for c in t[1]])
