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
from sluice.safety.normalize import spaced_runs, squeeze_spaced
from sluice.safety.policy import Category, SafetyPolicy
from sluice.safety.verdict import Action


@dataclass(slots=True, frozen=True)
class Match:
    category: str
    rule: str  # "literal:<n>" / "regex:<n>", numbered within the category
    start: int  # in the normalized text
    end: int


def _in_scope(cat: Category, scope: str) -> bool:
    if scope == "input":
        return cat.input_action is not Action.ALLOW
    if scope == "stream":
        return cat.check_output and cat.output_action is Action.REFUSE
    if scope == "log":
        return cat.check_output and cat.output_action is Action.LOG
    raise ValueError(f"unknown scope {scope!r}")


def is_word_char(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


class PatternSet:
    def __init__(self, policy: SafetyPolicy, scope: str = "input"):
        self.scope = scope
        self.ac = AhoCorasick()
        self.literal_rules: list[tuple[str, str]] = []  # per AC pattern id: (category, rule)
        # literals without their spaces, for a phrase spelled out letter by letter ("b o m b ...")
        self.compact_literals: list[tuple[str, int]] = []  # (letters, literal rule index)
        self.regex_rules: list[tuple[str, str]] = []
        literal_exprs: list[bytes] = []
        regex_exprs: list[bytes] = []
        for cat in policy.categories:
            if not _in_scope(cat, scope):
                continue
            for i, lit in enumerate(cat.literals):
                self.ac.add(lit)
                compact = lit.replace(" ", "")
                if len(compact) >= 4:  # shorter ones would hit ordinary spelled-out initials
                    self.compact_literals.append((compact, len(self.literal_rules)))
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

    def scan_spaced(self, text: str) -> Match | None:
        """Letter-spaced evasions in normalized `text`: the patterns over the view where each run
        of single letters is joined ("a dirty b o m b" → "a dirty bomb"), then each literal,
        spaces removed, where it covers a run (a phrase spelled out, wholly or in part). Offsets are in `text`; the
        rule carries ":spaced"."""
        runs = spaced_runs(text)
        if not runs:  # the common case: one regex pass, nothing else
            return None
        view, index = squeeze_spaced(text, runs)
        m = self.scan(view)
        if m is not None:
            return Match(m.category, m.rule + ":spaced", index[m.start], index[m.end - 1] + 1)
        # a phrase spelled out, maybe partly ("s.y.n.t.h.e.s.i.z.e s.a.r.i.n at home"): the
        # literals without spaces over the view without spaces, counted only where the hit
        # covers letter-spaced text (ordinary words run together would match across word
        # boundaries: "the rapist" in "therapist")
        letters = [(c, i) for c, i in zip(view, index) if c != " "]
        flat = "".join(c for c, _ in letters)
        for compact, rule_id in self.compact_literals:
            at = flat.find(compact)
            while at >= 0:
                first, last = letters[at][1], letters[at + len(compact) - 1][1]
                if any(start <= last and first < end for start, end in runs):
                    cat, rule = self.literal_rules[rule_id]
                    return Match(cat, rule + ":spaced", first, last + 1)
                at = flat.find(compact, at + 1)
        return None

    def scan_regex(self, text: str, offset: int = 0) -> Match | None:
        hit = self.regex_db.first(text)
        if hit is None:
            return None
        cat, rule = self.regex_rules[hit.pattern]
        return Match(cat, rule, offset + hit.start, offset + hit.end)
