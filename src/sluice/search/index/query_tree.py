"""A parsed query resolved to index terms: a small JSON tree the router sends to every shard.

    [TERM, t] | [PHRASE, [t, ...]] | [OR | AND, [node, ...]]
    [AND_NOT, [node, excluded]] | [AND_MAYBE, [required, optional]] | [ALL]
    [WILDCARD, prefix]   (the router only: expanded to terms before any shard searches)

(the kinds are NodeKind's; on the wire each is its value, "term", "phrase", ...)

Resolving runs each word through the index's analyzer (so `Running` becomes `run`, `e-mail`
the phrase `e mail`, `title:Linux` the term `XTITLE:linux`). The router resolves a query once:
the tree's terms are what phase 1 asks every shard about, the tree's JSON text is the
normalized query the result cache is keyed on, and the shards build their Xapian query from it
(query_builder.py) without parsing again.

A trailing wildcard resolves to its prefix term (`title:Pack*` → `XTITLE:pack`: lower-cased,
never stemmed). The router asks every shard for the index terms that start with it (Xapian's
own expansion: its `allterms(prefix)`), and `expand` puts their union in its place — an OR of
plain terms, each scored with its global statistics like any word — so the merge stays exact:
every shard scores the same terms, the ones one index holding every document would expand to.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from sluice.search.errors import QuerySyntaxError
from sluice.search.index.analyzer import Analyzer, field_prefix
from sluice.search.index.query_syntax import BoolOp, Node, Text, parse_query, plain_words


class NodeKind(str, enum.Enum):
    """The kinds of query-tree node: each node is [kind, ...] (a JSON list on the wire, so the
    tree is also the result cache's key; being a str enum, a kind reads and compares as its
    value)."""

    TERM = "term"  # [TERM, term]
    PHRASE = "phrase"  # [PHRASE, [term, ...]]: the terms in order
    OR = "or"  # [OR, [node, ...]]
    AND = "and"  # [AND, [node, ...]]
    AND_NOT = "and_not"  # [AND_NOT, [node, excluded]]: only the left side is scored
    AND_MAYBE = "and_maybe"  # [AND_MAYBE, [required, optional]]
    ALL = "all"  # [ALL]: every document (a query of only -excluded words)
    WILDCARD = "wildcard"  # [WILDCARD, prefix]: the router's only; expanded before any shard searches


Tree = list[Any]  # [NodeKind, ...]
MAX_TREE_NODES = 512
LEAVES = frozenset({NodeKind.TERM, NodeKind.PHRASE, NodeKind.ALL, NodeKind.WILDCARD})
PAIRS = frozenset({NodeKind.AND_NOT, NodeKind.AND_MAYBE})  # exactly two children
_ON_THE_WIRE = frozenset(NodeKind) - {NodeKind.WILDCARD}  # what a shard is sent


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedQuery:
    """A query's tree, and where each wildcard prefix term was written (for its errors)."""

    tree: Tree | None
    wildcards: dict[str, int]  # prefix term → the 0-based offset of its word in the query


def resolve(query: str, analyzer: Analyzer) -> Tree | None:
    """Query text → tree; None when no word of it yields a term (it matches nothing)."""
    return resolve_query(query, analyzer).tree


def resolve_query(query: str, analyzer: Analyzer) -> ResolvedQuery:
    words = plain_words(query)
    if words is not None:  # what _resolve makes of their OR, without its nodes (the router's path)
        kids = [t for w, _ in words if (t := _words(analyzer.query_terms(w))) is not None]
        return ResolvedQuery(_flat(NodeKind.OR, kids), {})
    wildcards: dict[str, int] = {}
    tree = _resolve(parse_query(query), analyzer, wildcards)
    return ResolvedQuery(tree, wildcards)


def _resolve(node: Node, analyzer: Analyzer, wildcards: dict[str, int] | None = None) -> Tree | None:
    if wildcards is None:
        wildcards = {}
    if isinstance(node, Text):
        prefix = field_prefix(node.field) if node.field else ""
        if node.wildcard:
            term = prefix + node.text.lower()
            wildcards.setdefault(term, node.position)
            return [NodeKind.WILDCARD, term]
        return _words([prefix + t for t in analyzer.query_terms(node.text)])
    kids = [t for c in node.children if (t := _resolve(c, analyzer, wildcards)) is not None]
    if node.op is BoolOp.OR:
        return _flat(NodeKind.OR, kids)
    if node.op is BoolOp.AND:
        return None if len(kids) < len(node.children) else _flat(NodeKind.AND, kids)
    if node.op is BoolOp.AND_NOT:
        if not kids or _resolve(node.children[0], analyzer, wildcards) is None:
            return None
        rest = _flat(NodeKind.OR, kids[1:])
        return kids[0] if rest is None else [NodeKind.AND_NOT, [kids[0], rest]]
    # "must": +required, plain alternatives, -excluded
    req = [t for c in node.required if (t := _resolve(c, analyzer, wildcards)) is not None]
    if len(req) < len(node.required):
        return None  # a required word that matches nothing
    exc = _flat(NodeKind.OR, [t for c in node.excluded if (t := _resolve(c, analyzer, wildcards)) is not None])
    opt = _flat(NodeKind.OR, kids)
    base: Tree | None
    if req:
        base = _flat(NodeKind.AND, req)
        if opt is not None:
            base = [NodeKind.AND_MAYBE, [base, opt]]
    else:
        base = opt if opt is not None or not node.excluded else [NodeKind.ALL]
    if base is None:
        return None
    return base if exc is None else [NodeKind.AND_NOT, [base, exc]]


def _words(terms: list[str]) -> Tree | None:
    """One word's (or phrase's) terms as a node: a term, a phrase, or None (no term)."""
    if not terms:
        return None
    return [NodeKind.TERM, terms[0]] if len(terms) == 1 else [NodeKind.PHRASE, terms]


def _flat(op: NodeKind, kids: list[Tree]) -> Tree | None:
    if not kids:
        return None
    if len(kids) == 1:
        return kids[0]
    out: list[Tree] = []
    for k in kids:
        out.extend(k[1] if k[0] == op else [k])  # (a OR b) OR c == a OR b OR c
    return [op, out]


# The walks below are module functions, not closures: a closure that calls itself is a reference
# cycle (function → cell → function) that only the cyclic collector frees, and the query path
# walks trees several times a query — each walk's garbage, with what it held, left to the next
# collection (docs/SEARCH.md "A local read's CPU, and the router's own").


def terms_of(tree: Tree | None) -> list[str]:
    """Every distinct term the tree scores, sorted (what phase 1 asks the shards about)."""
    found: set[str] = set()
    if tree is not None:
        _terms(tree, found)
    return sorted(found)


def _terms(t: Tree, found: set[str]) -> None:
    if t[0] == NodeKind.TERM:
        found.add(t[1])
    elif t[0] == NodeKind.PHRASE:
        found.update(t[1])
    elif t[0] not in LEAVES:  # a wildcard's terms are known once it is expanded
        for c in t[1]:
            _terms(c, found)


def scored_leaves(tree: Tree | None) -> dict[str, int] | None:
    """How many times each term adds its weight to a matching document's score — every term
    leaf except under AND_NOT's excluded side (Xapian weights only the left side) — or None
    when the tree has a phrase or `all` (a phrase's terms add weight only where the phrase
    matches: not known from the terms alone). What a one-round search corrects (bm25.py)."""
    if tree is None:
        return None
    counts: dict[str, int] = {}
    return counts if _scored(tree, True, counts) else None


def _scored(t: Tree, scored: bool, counts: dict[str, int]) -> bool:
    op = t[0]
    if op == NodeKind.TERM:
        if scored:
            counts[t[1]] = counts.get(t[1], 0) + 1
        return True
    if op in LEAVES:  # a phrase, all, a wildcard
        return False
    if op == NodeKind.AND_NOT:
        return _scored(t[1][0], scored, counts) and _scored(t[1][1], False, counts)
    return all(_scored(c, scored, counts) for c in t[1])


def wildcards_of(tree: Tree | None) -> list[str]:
    """The distinct wildcard prefix terms of the tree, sorted."""
    found: set[str] = set()
    if tree is not None:
        _wildcards(tree, found)
    return sorted(found)


def _wildcards(t: Tree, found: set[str]) -> None:
    if t[0] == NodeKind.WILDCARD:
        found.add(t[1])
    elif t[0] not in LEAVES:
        for c in t[1]:
            _wildcards(c, found)


def expand(tree: Tree | None, expansions: dict[str, list[str]]) -> Tree | None:
    """The tree with each wildcard replaced by the OR of its terms; a wildcard no term starts
    with matches nothing, exactly as a word without terms does in `resolve` (dropped from an
    OR, and an AND, a required clause or the left of a NOT with it matches nothing)."""
    if tree is None:
        return None
    op = tree[0]
    if op == NodeKind.WILDCARD:
        return _flat(NodeKind.OR, [[NodeKind.TERM, t] for t in sorted(expansions.get(tree[1], ()))])
    if op in LEAVES:
        return tree
    kids = [expand(c, expansions) for c in tree[1]]
    if op == NodeKind.OR:
        return _flat(NodeKind.OR, [k for k in kids if k is not None])
    if op == NodeKind.AND:
        whole = [k for k in kids if k is not None]
        return None if len(whole) < len(kids) else _flat(NodeKind.AND, whole)
    base, other = kids  # and_not, and_maybe: [left, right]
    if base is None:
        return None
    return base if other is None else [op, [base, other]]


def size(tree: Tree | None) -> int:
    """Nodes in the tree (check_tree's bound: MAX_TREE_NODES)."""
    if tree is None:
        return 0
    if tree[0] in LEAVES:
        return 1
    return 1 + sum(size(c) for c in tree[1])


_KEY = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode  # built once: ~2 µs a query less


def cache_key(tree: Tree | None) -> str:
    return _KEY(tree)


def check_tree(tree: Any) -> Tree:
    """A tree received over the wire: well formed and bounded, or QuerySyntaxError (position 0)."""
    _check(tree, 0, [0])
    return tree


def _check(t: Any, depth: int, count: list[int]) -> None:
    count[0] += 1
    if count[0] > MAX_TREE_NODES or depth > 40:
        raise QuerySyntaxError(0, "query tree too large")
    if not isinstance(t, list) or not t or not isinstance(t[0], str) or t[0] not in _ON_THE_WIRE:
        raise QuerySyntaxError(0, "malformed query tree")
    op = t[0]  # a kind's value (NodeKind compares equal to it)
    if op == NodeKind.ALL:
        return
    if len(t) != 2:
        raise QuerySyntaxError(0, f"malformed {op} node")
    if op == NodeKind.TERM:
        if not isinstance(t[1], str) or not t[1]:
            raise QuerySyntaxError(0, "malformed term")
    elif op == NodeKind.PHRASE:
        if not isinstance(t[1], list) or len(t[1]) < 2 or not all(isinstance(x, str) and x for x in t[1]):
            raise QuerySyntaxError(0, "malformed phrase")
    else:
        if not isinstance(t[1], list) or not t[1] or (op in PAIRS and len(t[1]) != 2):
            raise QuerySyntaxError(0, f"malformed {op} node")
        for c in t[1]:
            _check(c, depth + 1, count)
