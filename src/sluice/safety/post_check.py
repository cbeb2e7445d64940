"""L4: the finished reply, checked whole — the patterns over the full text (catching what a
stream's bounded regex window could not: long regex matches) and, asynchronously, the
classifier over it. Runs before the final stop is sent, so it delays the end of a stream, never
its first token; for a non-streaming reply it is the output check. It also reads the
letter-spaced view ("b o m b"), which the stream guard does not."""

from __future__ import annotations

from sluice.safety.normalize import Normalized
from sluice.safety.patterns import PatternSet
from sluice.safety.verdict import Action, Layer, Verdict


def post_check_patterns(patterns: PatternSet, text: str, actions: dict[str, Action]) -> Verdict | None:
    norm = Normalized(text)
    m = patterns.scan(norm.text) or patterns.scan_spaced(norm.text)
    if m is None:
        return None
    start, end = norm.span(m.start, m.end)
    return Verdict(Layer.L4, m.category, m.rule, start, end, action=actions.get(m.category, Action.REFUSE))
