"""L3: the streaming output guard — one per stream (per content block).

`feed(delta)` returns the text that is safe to send now. It holds back only the tail of
unreleased text that could still turn into a banned literal: the longest suffix of the
normalized text that is a prefix of some literal starting at a word start. The Aho-Corasick
state after the last character gives that suffix exactly (its depth; walking its failure links
gives the shorter candidates when the longest does not sit at a word start). The held
normalized characters map back to original characters through the normalizer's offsets.

Why this is enough: if a literal eventually matches at normalized [a, b), then at every moment
before b the text from a on was a prefix of it at a word start, so the release point never
passed a — no character of a banned literal is ever sent, however the phrase is split across
deltas, cased, spaced or disguised (the normalizer folds those). Benign text flows with no fixed
delay: a delta that ends in the middle of nothing that could start a literal is sent whole.

Regexes have no prefix structure to hold back on, so they get a bounded look-behind instead:
after each delta the last REGEX_WINDOW normalized characters are scanned; a match kills the
stream (the part of it already sent has leaked — put what must never be sent in `literals`).
Longer regex matches are left to L4.

A match returns a kill verdict; nothing more is ever released from this guard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sluice.safety.normalize import Normalizer
from sluice.safety.patterns import PatternSet, is_word_char
from sluice.safety.verdict import Action, Layer, Verdict

REGEX_WINDOW = 256  # normalized characters a regex check looks back over


@dataclass(slots=True)
class GuardStats:
    """Totals over every stream a pipeline guarded (per-token cost, mean hold-back)."""

    feeds: int = 0
    seconds: float = 0.0
    holdback_sum: int = 0  # original characters held after each feed, summed
    kills: int = 0

    @property
    def mean_holdback(self) -> float:
        return self.holdback_sum / self.feeds if self.feeds else 0.0

    @property
    def us_per_feed(self) -> float:
        return self.seconds / self.feeds * 1e6 if self.feeds else 0.0


class StreamGuard:
    def __init__(self, patterns: PatternSet, action: dict[str, Action] | None = None, shared: GuardStats | None = None):
        self.p = patterns
        self._shared = shared  # the pipeline's totals across streams
        self._action = action or {}
        self.norm = Normalizer(keep=False)
        self._keep = max(patterns.max_literal, REGEX_WINDOW) + 2
        self._parts: list[str] = []
        self.total = 0  # original characters received
        self.released = 0  # original characters released
        self._pending = ""  # original text received and not yet released
        self._state = 0
        self._tail = ""  # the last normalized characters (at least _keep of them)
        self._tail_src: list[int] = []  # their original indices
        self._norm_len = 0  # normalized characters so far
        self.killed: Verdict | None = None
        self._window_at = 0
        # hold-back and cost statistics (the benchmark reads these)
        self.feeds = 0
        self.holdback_sum = 0
        self.holdback_max = 0
        self.feed_seconds = 0.0

    # -- the stream ----------------------------------------------------------------------------
    def feed(self, delta: str) -> tuple[str, Verdict | None]:
        """Returns (text safe to send now, kill verdict or None)."""
        if self.killed is not None:
            return "", self.killed
        t0 = time.perf_counter()
        self._parts.append(delta)
        self._pending += delta
        self.total += len(delta)
        added, src = self.norm.feed(delta)
        verdict = self._advance(added, src) if added else None
        out = "" if verdict is not None else self._release(self._held_norm())
        dt = time.perf_counter() - t0
        self.feed_seconds += dt
        if self._shared is not None:
            self._shared.feeds += 1
            self._shared.seconds += dt
            self._shared.holdback_sum += self.held
            self._shared.kills += verdict is not None
        return out, verdict

    def flush(self) -> tuple[str, Verdict | None]:
        """End of the stream: the held tail can no longer complete a literal, so it is sent."""
        if self.killed is not None:
            return "", self.killed
        return self._release(0), None

    finish = flush

    def due_window(self, every_chars: int, window_chars: int) -> str | None:
        """The periodic classifier hook: every `every_chars` released characters, the trailing
        `window_chars` of the stream to classify (the caller schedules it asynchronously)."""
        if every_chars <= 0 or self.released - self._window_at < every_chars:
            return None
        self._window_at = self.released
        return self.text_so_far[-window_chars:]

    # -- internals --------------------------------------------------------------------------------
    def _advance(self, added: str, src: list[int]) -> Verdict | None:
        ac = self.p.ac
        tail = self._tail + added
        tail_src = self._tail_src
        tail_src.extend(src)
        first = len(tail) - len(added)
        state = self._state
        verdict = None
        goto, fail, outs = ac.goto, ac.fail, ac.out
        for i in range(first, len(tail)):
            ch = tail[i]
            while state and ch not in goto[state]:  # AhoCorasick.step, inlined: the per-token hot loop
                state = fail[state]
            state = goto[state].get(ch, 0)
            for pid in outs[state]:
                start = i + 1 - len(ac.patterns[pid])
                if start > 0 and is_word_char(tail[start - 1]) and is_word_char(tail[start]):
                    continue  # not at a word start ("kill" inside "skill")
                cat, rule = self.p.literal_rules[pid]
                verdict = self._kill(cat, rule, tail_src[start], tail_src[i] + 1)
                break
            if verdict is not None:
                break
        if verdict is None and self.p.has_regexes:
            lo = max(0, len(tail) - REGEX_WINDOW)
            m = self.p.scan_regex(tail[lo:], lo)
            if m is not None:
                verdict = self._kill(m.category, m.rule, tail_src[m.start], tail_src[m.end - 1] + 1)
        self._state = state
        self._norm_len += len(added)
        if len(tail) > 2 * self._keep:  # trim rarely: amortized O(1) per character
            tail, tail_src = tail[-self._keep :], tail_src[-self._keep :]
        self._tail, self._tail_src = tail, tail_src
        return verdict

    def _held_norm(self) -> int:
        """Normalized characters to hold: the longest suffix that is a literal's prefix at a word start."""
        ac, tail, s = self.p.ac, self._tail, self._state
        while s:
            d = ac.depth[s]
            j = len(tail) - d  # the suffix starts at tail[j]
            if j <= 0 or not (is_word_char(tail[j - 1]) and is_word_char(tail[j])):
                return d
            s = ac.fail[s]
        return 0

    def _release(self, held_norm: int) -> str:
        if held_norm:
            safe_end = max(self._tail_src[len(self._tail_src) - held_norm], self.released)
        else:
            safe_end = self.total
        n = safe_end - self.released
        out, self._pending = self._pending[:n], self._pending[n:]
        self.released = safe_end
        held = self.total - safe_end
        self.feeds += 1
        self.holdback_sum += held
        self.holdback_max = max(self.holdback_max, held)
        return out

    def _kill(self, category: str, rule: str, start: int, end: int) -> Verdict:
        self.killed = Verdict(Layer.L3, category, rule, start, end, action=self._action.get(category, Action.REFUSE))
        return self.killed

    # -- reporting ------------------------------------------------------------------------------
    @property
    def held(self) -> int:
        """Original characters currently held back."""
        return self.total - self.released

    @property
    def mean_holdback(self) -> float:
        return self.holdback_sum / self.feeds if self.feeds else 0.0

    @property
    def text_so_far(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""
