"""A small Aho-Corasick automaton over normalized characters (the stream guard's core).

Hand-written rather than a library because the stream guard needs what libraries do not expose:
the automaton state after each character, whose depth is exactly the length of the longest
suffix of the text so far that is a prefix of some banned pattern. That suffix is all the guard
must hold back; everything before it can never become part of a match.
"""

from __future__ import annotations

from collections import deque


class AhoCorasick:
    def __init__(self) -> None:
        self.goto: list[dict[str, int]] = [{}]
        self.fail: list[int] = [0]
        self.depth: list[int] = [0]
        self.out: list[list[int]] = [[]]  # pattern ids ending at this state (incl. via fail links)
        self.patterns: list[str] = []
        self._built = False

    def add(self, pattern: str) -> int:
        if not pattern:
            raise ValueError("empty pattern")
        state = 0
        for ch in pattern:
            nxt = self.goto[state].get(ch)
            if nxt is None:
                nxt = len(self.goto)
                self.goto.append({})
                self.fail.append(0)
                self.depth.append(self.depth[state] + 1)
                self.out.append([])
                self.goto[state][ch] = nxt
            state = nxt
        self.patterns.append(pattern)
        self.out[state].append(len(self.patterns) - 1)
        self._built = False
        return len(self.patterns) - 1

    def build(self) -> AhoCorasick:
        queue = deque(self.goto[0].values())
        for s in queue:
            self.fail[s] = 0
        while queue:
            s = queue.popleft()
            for ch, t in self.goto[s].items():
                queue.append(t)
                f = self.fail[s]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[t] = self.goto[f].get(ch, 0) if self.goto[f].get(ch, 0) != t else 0
                self.out[t] = self.out[t] + self.out[self.fail[t]]
        self._built = True
        return self

    def step(self, state: int, ch: str) -> int:
        while state and ch not in self.goto[state]:
            state = self.fail[state]
        return self.goto[state].get(ch, 0)

    def search(self, text: str) -> list[tuple[int, int]]:
        """All matches as (end index exclusive, pattern id)."""
        assert self._built
        state, found = 0, []
        for i, ch in enumerate(text):
            state = self.step(state, ch)
            for pid in self.out[state]:
                found.append((i + 1, pid))
        return found
