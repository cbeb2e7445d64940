"""The query language: text → a syntax tree, or QuerySyntaxError naming the position.

    python AND (packag* OR "package manager") -title:library +body:tool

- words separated by spaces are alternatives (OR), ranked by BM25;
- `+word` must match, `-word` must not (like Xapian's QueryParser and most engines);
- `AND`, `OR`, `NOT` (upper case) combine; precedence NOT > AND > OR; parentheses group;
- `"a phrase"` matches the words in order; `field:word` and `field:"a phrase"` search one field;
- `word*` (a trailing wildcard) matches every index term that starts with `word`, lower-cased
  but not stemmed (so `pythones*` never matches `python`); `*` anywhere else, in a phrase, or
  after something that is not one word of letters and digits is a syntax error.

The grammar is small and ours (not Xapian's QueryParser) so that an error names the character
where it happened, the router can list the query's terms before any shard is asked (phase 1 of
a global-statistics query), and a normalized form keys the result cache. Words are tokenized and
stemmed later by the index's own analyzer (query_tree.py).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable

from sluice.search.errors import QuerySyntaxError

MAX_QUERY_CHARS = 2048  # the one definition (the contract, search/contract.py, re-exports it)
MAX_CLAUSES = 64
MAX_DEPTH = 16
_FIELD = re.compile(r"([a-z][a-z0-9_]{0,63}):(?=\S)")
_OPERATORS = {"AND", "OR", "NOT"}
_SPECIAL = set('()"')
WILDCARD = "*"
# a query without any of these is words between whitespace (re's \s is str.isspace, as _lex's)
_NOT_PLAIN = re.compile(r'[()"+\-:*]')
_RUN = re.compile(r"\S+")


@dataclasses.dataclass(frozen=True, slots=True)
class Text:
    """Words (a bare word, or a quoted phrase when `phrase`) in one field (None: the default fields)."""

    text: str
    field: str | None
    phrase: bool
    position: int
    wildcard: bool = False  # `text*`: every term starting with text (query_tree.py expands it)


class BoolOp(str, enum.Enum):
    OR = "or"
    AND = "and"
    AND_NOT = "and_not"  # children[0] minus the rest
    MUST = "must"  # juxtaposed clauses with +/-: required, plain alternatives, excluded


@dataclasses.dataclass(frozen=True, slots=True)
class Bool:
    op: BoolOp
    children: tuple[Node, ...]
    required: tuple[Node, ...] = ()  # for "must": +clauses
    excluded: tuple[Node, ...] = ()  # for "must": -clauses


Node = Text | Bool


@dataclasses.dataclass(slots=True)
class _Token:
    kind: str  # word | wildcard | phrase | op | lparen | rparen | plus | minus
    value: str
    position: int
    field: str | None = None


def _check_wildcard(word: str, at: int) -> None:
    """A word holding `*`: one word of letters and digits, then one `*` at its end."""
    star = word.index(WILDCARD)
    if star != len(word) - 1:
        raise QuerySyntaxError(at + star, "'*' is allowed only at the end of a word (a trailing wildcard)")
    if not word[:-1]:
        raise QuerySyntaxError(at, "a wildcard needs a word before '*'")
    if not word[:-1].isalnum():
        raise QuerySyntaxError(at, "a trailing wildcard applies to one word of letters and digits")


def _lex(q: str) -> list[_Token]:
    out: list[_Token] = []
    i, n = 0, len(q)
    while i < n:
        c = q[i]
        if c.isspace():
            i += 1
            continue
        start = i
        if c == "(":
            out.append(_Token("lparen", c, i))
            i += 1
            continue
        if c == ")":
            out.append(_Token("rparen", c, i))
            i += 1
            continue
        if c in "+-" and i + 1 < n and not q[i + 1].isspace() and q[i + 1] not in "+-)":
            out.append(_Token("plus" if c == "+" else "minus", c, i))
            i += 1
            continue
        field = None
        m = _FIELD.match(q, i)
        if m:
            field = m.group(1)
            i = m.end()
        if i < n and q[i] == '"':
            end = q.find('"', i + 1)
            if end < 0:
                raise QuerySyntaxError(i, "unterminated quote")
            star = q.find(WILDCARD, i + 1, end)
            if star >= 0:
                raise QuerySyntaxError(star, "a wildcard is not allowed inside a phrase")
            out.append(_Token("phrase", q[i + 1 : end], start, field))
            i = end + 1
            continue
        if i < n and q[i] == "(" and field is not None:
            raise QuerySyntaxError(i, f"a field ({field}:) applies to a word or a phrase, not to parentheses")
        j = i
        while j < n and not q[j].isspace() and q[j] not in _SPECIAL:
            j += 1
        word = q[i:j]
        kind = "op" if field is None and word in _OPERATORS else "word"
        if WILDCARD in word:
            _check_wildcard(word, i)
            kind = "wildcard"
        out.append(_Token(kind, word, start, field))
        i = j
    return out


class _Parser:
    def __init__(self, query: str):
        self.q = query
        self.toks = _lex(query)
        self.i = 0
        self.clauses = 0

    def peek(self) -> _Token | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def end_pos(self) -> int:
        return len(self.q)

    def parse(self) -> Node:
        if not self.toks:
            raise QuerySyntaxError(0, "empty query")
        node = self.or_expr(0)
        tok = self.peek()
        if tok is not None:
            raise QuerySyntaxError(
                tok.position, "unmatched ')'" if tok.kind == "rparen" else f"unexpected {tok.value!r}"
            )
        return node

    def _binary(self, word: str, op: BoolOp, sub: Callable[[int], Node], depth: int) -> Node:
        parts = [sub(depth)]
        while (tok := self.peek()) is not None and tok.kind == "op" and tok.value == word:
            self.i += 1
            if self.peek() is None:
                raise QuerySyntaxError(tok.position, f"{word} needs something after it")
            parts.append(sub(depth))
        return parts[0] if len(parts) == 1 else Bool(op, tuple(parts))

    def or_expr(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            tok = self.peek()
            raise QuerySyntaxError(tok.position if tok is not None else 0, f"nested deeper than {MAX_DEPTH}")
        return self._binary("OR", BoolOp.OR, self.and_expr, depth)

    def and_expr(self, depth: int) -> Node:
        return self._binary("AND", BoolOp.AND, self.not_expr, depth)

    def not_expr(self, depth: int) -> Node:
        return self._binary("NOT", BoolOp.AND_NOT, self.sequence, depth)

    def sequence(self, depth: int) -> Node:
        plain: list[Node] = []
        required: list[Node] = []
        excluded: list[Node] = []
        while (tok := self.peek()) is not None and tok.kind not in ("op", "rparen"):
            sign = None
            if tok.kind in ("plus", "minus"):
                sign = tok.kind
                self.i += 1
                tok = self.peek()
                if tok is None or tok.kind in ("op", "rparen", "plus", "minus"):
                    raise QuerySyntaxError(
                        self.toks[self.i - 1].position, f"'{'+' if sign == 'plus' else '-'}' needs a word after it"
                    )
            node = self.unit(depth)
            {"plus": required, "minus": excluded, None: plain}[sign].append(node)
        if not (plain or required or excluded):
            tok = self.peek()
            pos = tok.position if tok is not None else self.end_pos()
            what = f"{tok.value!r}" if tok is not None else "end of query"
            raise QuerySyntaxError(pos, f"expected a word, a phrase or '(' before {what}")
        if not required and not excluded and len(plain) == 1:
            return plain[0]
        if not required and not excluded:
            return Bool(BoolOp.OR, tuple(plain))
        return Bool(BoolOp.MUST, tuple(plain), tuple(required), tuple(excluded))

    def unit(self, depth: int) -> Node:
        tok = self.toks[self.i]
        if tok.kind == "lparen":
            self.i += 1
            if (nxt := self.peek()) is not None and nxt.kind == "rparen":
                raise QuerySyntaxError(nxt.position, "empty parentheses")
            node = self.or_expr(depth + 1)
            close = self.peek()
            if close is None or close.kind != "rparen":
                raise QuerySyntaxError(tok.position, "unmatched '('")
            self.i += 1
            return node
        self.i += 1
        self.clauses += 1
        if self.clauses > MAX_CLAUSES:
            raise QuerySyntaxError(tok.position, f"more than {MAX_CLAUSES} words or phrases")
        if tok.kind == "wildcard":
            return Text(tok.value[:-1], tok.field, False, tok.position, wildcard=True)
        return Text(tok.value, tok.field, tok.kind == "phrase", tok.position)


def parse_query(query: str) -> Node:
    if len(query) > MAX_QUERY_CHARS:
        raise QuerySyntaxError(MAX_QUERY_CHARS, f"a query is at most {MAX_QUERY_CHARS} characters")
    words = plain_words(query)
    if words is not None:
        texts = tuple(Text(w, None, False, at) for w, at in words)
        return texts[0] if len(texts) == 1 else Bool(BoolOp.OR, texts)
    return _Parser(query).parse()


def plain_words(query: str) -> list[tuple[str, int]] | None:
    """The words of a query of plain words only, each with its offset, or None for any other
    query. Most queries are that — no operator, field, phrase, sign, wildcard or parenthesis,
    1 to MAX_CLAUSES words, at most MAX_QUERY_CHARS characters — and the grammar makes of them
    the OR of the words (one word alone): this says so without lexing character by character
    and descending through each level of the grammar per word (~3x less CPU; a test compares
    the two)."""
    if len(query) > MAX_QUERY_CHARS or _NOT_PLAIN.search(query) is not None:
        return None
    words = [(m[0], m.start()) for m in _RUN.finditer(query)]
    if not 0 < len(words) <= MAX_CLAUSES or any(w in _OPERATORS for w, _ in words):
        return None
    return words


def dense_text(query: str) -> str:
    """What a dense search embeds: the query's words and phrases that count for a match, in
    order, without the query language (operators, `field:`, `*`, quotes) and without what it
    excludes (`-word`, `NOT word`): `python AND "package manager" -java` → `python package
    manager`. QuerySyntaxError as for any query."""
    words: list[str] = []
    _dense_words(parse_query(query), words)  # a module function: a self-calling closure is a cycle
    return " ".join(w for w in words if w)


def _dense_words(node: Node, words: list[str]) -> None:
    if isinstance(node, Text):
        words.append(node.text)
    elif node.op is BoolOp.AND_NOT:
        _dense_words(node.children[0], words)
    else:
        for child in (*node.required, *node.children):
            _dense_words(child, words)
