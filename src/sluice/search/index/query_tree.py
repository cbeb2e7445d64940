"""A parsed query resolved to index terms: a small JSON tree the router sends to every shard.

    ["term", t] | ["phrase", [t, ...]] | ["or" | "and", [node, ...]]
    ["and_not", [node, excluded]] | ["and_maybe", [required, optional]] | ["all"]

Resolving runs each word through the index's analyzer (so `Running` becomes `run`, `e-mail`
the phrase `e mail`, `title:Linux` the term `XTITLE:linux`). The router resolves a query once:
the tree's terms are what phase 1 asks every shard about, the tree's JSON text is the
normalized query the result cache is keyed on, and the shards build their Xapian query from it
(query_builder.py) without parsing again.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.search.errors import QuerySyntaxError
from sluice.search.index.analyzer import Analyzer, field_prefix
from sluice.search.index.query_syntax import Bool, Node, Text, parse_query

Tree = list[Any]
MAX_TREE_NODES = 512
_OPS = {"term", "phrase", "or", "and", "and_not", "and_maybe", "all"}


def resolve(query: str, analyzer: Analyzer) -> Tree | None:
    """Query text → tree; None when no word of it yields a term (it matches nothing)."""
    return _resolve(parse_query(query), analyzer)


def _resolve(node: Node, analyzer: Analyzer) -> Tree | None:
    if isinstance(node, Text):
        prefix = field_prefix(node.field) if node.field else ""
        terms = [prefix + t for t in analyzer.query_terms(node.text)]
        if not terms:
            return None
        return ["term", terms[0]] if len(terms) == 1 else ["phrase", terms]
    kids = [t for c in node.children if (t := _resolve(c, analyzer)) is not None]
    if node.op == "or":
        return _flat("or", kids)
    if node.op == "and":
        return None if len(kids) < len(node.children) else _flat("and", kids)
    if node.op == "and_not":
        if not kids or _resolve(node.children[0], analyzer) is None:
            return None
        rest = _flat("or", kids[1:])
        return kids[0] if rest is None else ["and_not", [kids[0], rest]]
    # "must": +required, plain alternatives, -excluded
    req = [t for c in node.required if (t := _resolve(c, analyzer)) is not None]
    if len(req) < len(node.required):
        return None  # a required word that matches nothing
    exc = _flat("or", [t for c in node.excluded if (t := _resolve(c, analyzer)) is not None])
    opt = _flat("or", kids)
    base: Tree | None
    if req:
        base = _flat("and", req)
        if opt is not None:
            base = ["and_maybe", [base, opt]]
    else:
        base = opt if opt is not None or not node.excluded else ["all"]
    if base is None:
        return None
    return base if exc is None else ["and_not", [base, exc]]


def _flat(op: str, kids: list[Tree]) -> Tree | None:
    if not kids:
        return None
    if len(kids) == 1:
        return kids[0]
    out: list[Tree] = []
    for k in kids:
        out.extend(k[1] if k[0] == op else [k])  # (a OR b) OR c == a OR b OR c
    return [op, out]


def terms_of(tree: Tree | None) -> list[str]:
    """Every distinct term the tree scores, sorted (what phase 1 asks the shards about)."""
    found: set[str] = set()

    def walk(t: Tree) -> None:
        if t[0] == "term":
            found.add(t[1])
        elif t[0] == "phrase":
            found.update(t[1])
        elif t[0] != "all":
            for c in t[1]:
                walk(c)

    if tree is not None:
        walk(tree)
    return sorted(found)


def scored_leaves(tree: Tree | None) -> dict[str, int] | None:
    """How many times each term adds its weight to a matching document's score — every term
    leaf except under AND_NOT's excluded side (Xapian weights only the left side) — or None
    when the tree has a phrase or `all` (a phrase's terms add weight only where the phrase
    matches: not known from the terms alone). What a one-round search corrects (bm25.py)."""
    if tree is None:
        return None
    counts: dict[str, int] = {}

    def walk(t: Tree, scored: bool) -> bool:
        op = t[0]
        if op == "term":
            if scored:
                counts[t[1]] = counts.get(t[1], 0) + 1
            return True
        if op in ("phrase", "all"):
            return False
        if op == "and_not":
            return walk(t[1][0], scored) and walk(t[1][1], False)
        return all(walk(c, scored) for c in t[1])

    return counts if walk(tree, True) else None


def cache_key(tree: Tree | None) -> str:
    return json.dumps(tree, separators=(",", ":"), ensure_ascii=False)


def check_tree(tree: Any) -> Tree:
    """A tree received over the wire: well formed and bounded, or QuerySyntaxError (position 0)."""
    count = 0

    def walk(t: Any, depth: int) -> None:
        nonlocal count
        count += 1
        if count > MAX_TREE_NODES or depth > 40:
            raise QuerySyntaxError(0, "query tree too large")
        if not isinstance(t, list) or not t or t[0] not in _OPS:
            raise QuerySyntaxError(0, "malformed query tree")
        op = t[0]
        if op == "all":
            return
        if len(t) != 2:
            raise QuerySyntaxError(0, f"malformed {op} node")
        if op == "term":
            if not isinstance(t[1], str) or not t[1]:
                raise QuerySyntaxError(0, "malformed term")
        elif op == "phrase":
            if not isinstance(t[1], list) or len(t[1]) < 2 or not all(isinstance(x, str) and x for x in t[1]):
                raise QuerySyntaxError(0, "malformed phrase")
        else:
            if not isinstance(t[1], list) or not t[1] or (op in ("and_not", "and_maybe") and len(t[1]) != 2):
                raise QuerySyntaxError(0, f"malformed {op} node")
            for c in t[1]:
                walk(c, depth + 1)

    walk(tree, 0)
    return tree
