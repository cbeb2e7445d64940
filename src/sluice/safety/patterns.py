"""A policy's patterns, compiled for one scope.

- `scan()` (L1 input, L4 post-check): one hyperscan database holding every literal and regex of
  the scope, over the whole normalized text.
- the stream guard (L3) walks `ac`, an Aho-Corasick automaton over the literals, one normalized
  character at a time: its state depth is what the guard must hold back; and it runs `regex_db`
  over a bounded trailing window after each delta.
Scopes: "input" (categories whose input_action is not allow), "stream" (checked on output and
refused: L3 and L4), "log" (checked on output and only logged: L4).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.safety.aho_corasick import AhoCorasick
from sluice.safety.multipattern import MultiPattern, literal_expression
from sluice.safety.policy import Category, SafetyPolicy


@dataclass(slots=True, frozen=True)
class Match:
    category: str
    rule: str  # "literal:<n>" / "regex:<n>", numbered within the category
    start: int  # in the normalized text
    end: int


def _in_scope(cat: Category, scope: str) -> bool:
    if scope == "input":
        return cat.input_action != "allow"
    if scope == "stream":
        return cat.check_output and cat.output_action == "refuse"
    if scope == "log":
        return cat.check_output and cat.output_action == "log"
    raise ValueError(f"unknown scope {scope!r}")


def is_word_char(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


class PatternSet:
    def __init__(self, policy: SafetyPolicy, scope: str = "input"):
        self.scope = scope
        self.ac = AhoCorasick()
        self.literal_rules: list[tuple[str, str]] = []  # per AC pattern id: (category, rule)
        self.regex_rules: list[tuple[str, str]] = []
        literal_exprs: list[bytes] = []
        regex_exprs: list[bytes] = []
        for cat in policy.categories:
            if not _in_scope(cat, scope):
                continue
            for i, lit in enumerate(cat.literals):
                self.ac.add(lit)
                self.literal_rules.append((cat.name, f"literal:{i}"))
                literal_exprs.append(literal_expression(lit))
            for i, rx in enumerate(cat.regexes):
                self.regex_rules.append((cat.name, f"regex:{i}"))
                regex_exprs.append(rx.encode())
        self.ac.build()
        self.all_db = MultiPattern(literal_exprs + regex_exprs)
        self.regex_db = MultiPattern(regex_exprs)
        self.rules = self.literal_rules + self.regex_rules  # all_db's pattern ids
        self.max_literal = max((len(p) for p in self.ac.patterns), default=0)

    @property
    def has_regexes(self) -> bool:
        return bool(self.regex_rules)

    def scan(self, text: str) -> Match | None:
        """The first match (by end) in normalized `text`."""
        hit = self.all_db.first(text)
        if hit is None:
            return None
        cat, rule = self.rules[hit.pattern]
        return Match(cat, rule, hit.start, hit.end)

    def scan_regex(self, text: str, offset: int = 0) -> Match | None:
        hit = self.regex_db.first(text)
        if hit is None:
            return None
        cat, rule = self.regex_rules[hit.pattern]
        return Match(cat, rule, offset + hit.start, offset + hit.end)
