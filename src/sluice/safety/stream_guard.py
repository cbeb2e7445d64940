"""L3: the streaming output guard.

`feed(delta)` returns the text that is safe to send now. It holds back only the tail of
unreleased text that could still turn into a banned literal — the automaton state's depth after
the last normalized character, mapped back to original characters — so a banned phrase split
across any token boundary is never sent, and benign text flows with (measured) under a token of
delay. Regexes are checked on a trailing window at every delta. A match returns a kill verdict
and nothing more is ever released.
"""

from __future__ import annotations

from sluice.safety.normalize import Normalizer
from sluice.safety.patterns import PatternSet
from sluice.safety.verdict import Verdict

REGEX_WINDOW = 256  # normalized chars a regex check looks back over


class StreamGuard:
    def __init__(self, patterns: PatternSet):
        self.p = patterns
        self.norm = Normalizer()
        self.original: list[str] = []
        self.released = 0  # original chars sent
        self.state = 0
        self.killed: Verdict | None = None
        self.holdback_samples: list[int] = []
        self._regex_from = 0

    def feed(self, delta: str) -> tuple[str, Verdict | None]:
        if self.killed is not None:
            return "", self.killed
        self.original.append(delta)
        start = len(self.norm.src)
        added = self.norm.feed(delta)
        text = self.norm.text
        for i, ch in enumerate(added):
            self.state = self.p.ac.step(self.state, ch)
            for pid in self.p.ac.out[self.state]:
                m = self.p.literal_match(text, start + i + 1, pid)
                if m is not None:
                    return self._kill(m.category, m.rule, m.start, m.end)
        if self.p.regexes and added:
            lo = max(0, len(text) - REGEX_WINDOW)
            m = self.p.scan_regex(text[lo:], lo)
            if m is not None:
                return self._kill(m.category, m.rule, m.start, m.end)
        return self._release(self.p.ac.depth[self.state]), None

    def finish(self) -> tuple[str, Verdict | None]:
        """End of the stream: the held tail can no longer complete a pattern."""
        if self.killed is not None:
            return "", self.killed
        return self._release(0), None

    def _release(self, held_norm: int) -> str:
        full = "".join(self.original)
        if held_norm and len(self.norm.src) >= held_norm:
            safe_end = self.norm.src[len(self.norm.src) - held_norm]  # first original char still held
        else:
            safe_end = len(full)
        safe_end = max(safe_end, self.released)
        out = full[self.released : safe_end]
        self.released = safe_end
        self.holdback_samples.append(len(full) - safe_end)
        return out

    def _kill(self, category: str, rule: str, nstart: int, nend: int) -> tuple[str, Verdict]:
        src = self.norm.src
        self.killed = Verdict("L3", category, rule, src[nstart], src[nend - 1] + 1)
        return "", self.killed

    @property
    def text_so_far(self) -> str:
        return "".join(self.original)

    @property
    def mean_holdback(self) -> float:
        return sum(self.holdback_samples) / len(self.holdback_samples) if self.holdback_samples else 0.0
