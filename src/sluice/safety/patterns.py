"""All of a policy's literals in one automaton, its regexes alongside; matching on normalized text."""

from __future__ import annotations

import re
from dataclasses import dataclass

from sluice.safety.aho_corasick import AhoCorasick
from sluice.safety.policy import SafetyPolicy


@dataclass(slots=True, frozen=True)
class Match:
    category: str
    rule: str
    start: int  # in the normalized text
    end: int


class PatternSet:
    def __init__(self, policy: SafetyPolicy, output: bool = False):
        """`output=True` keeps only categories checked on model output."""
        self.ac = AhoCorasick()
        self.literal_category: list[str] = []
        self.regexes: list[tuple[str, int, re.Pattern]] = []
        for cat in policy.categories:
            if output and not cat.check_output:
                continue
            for i, lit in enumerate(cat.literals):
                self.ac.add(lit)
                self.literal_category.append(f"{cat.name}\x00literal:{i}")
            for i, rx in enumerate(cat.regexes):
                self.regexes.append((cat.name, i, rx))
        self.ac.build()
        self.max_literal = max((len(p) for p in self.ac.patterns), default=0)

    def literal_match(self, text: str, end: int, pid: int) -> Match | None:
        """A literal ending at `end` counts only at a word start (so "kill" is not in "skill")."""
        start = end - len(self.ac.patterns[pid])
        if start > 0 and text[start - 1].isalnum() and self.ac.patterns[pid][0].isalnum():
            return None
        cat, rule = self.literal_category[pid].split("\x00")
        return Match(cat, rule, start, end)

    def scan(self, text: str) -> Match | None:
        for end, pid in self.ac.search(text):
            m = self.literal_match(text, end, pid)
            if m is not None:
                return m
        return self.scan_regex(text, 0)

    def scan_regex(self, text: str, offset: int) -> Match | None:
        for cat, i, rx in self.regexes:
            m = rx.search(text)
            if m:
                return Match(cat, f"regex:{i}", offset + m.start(), offset + m.end())
        return None
