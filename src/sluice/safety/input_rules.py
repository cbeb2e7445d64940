"""L1: the input check, before any 200 — system prompt, every turn, tool results, and the text
inside base64-looking blobs (a common wrapper for banned requests)."""

from __future__ import annotations

import base64
import binascii
import re

from sluice.safety.normalize import normalize
from sluice.safety.patterns import PatternSet
from sluice.safety.verdict import Verdict

_BLOB = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")


def _decoded_blobs(text: str) -> list[tuple[int, int, str]]:
    out = []
    for m in _BLOB.finditer(text):
        raw = m.group(0)
        try:
            data = base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=b"-_" if ("-" in raw or "_" in raw) else None, validate=True)
            decoded = data.decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue
        if decoded.isprintable() or all(c.isprintable() or c.isspace() for c in decoded):
            out.append((m.start(), m.end(), decoded))
    return out


def check_input(patterns: PatternSet, texts: list[str]) -> Verdict | None:
    """The first banned match across `texts` (offsets are into the matching text)."""
    for text in texts:
        norm, src = normalize(text)
        m = patterns.scan(norm)
        if m is not None:
            return Verdict("L1", m.category, m.rule, src[m.start], src[m.end - 1] + 1)
        for start, end, decoded in _decoded_blobs(text):
            m = patterns.scan(normalize(decoded)[0])
            if m is not None:
                return Verdict("L1", m.category, m.rule + ":base64", start, end)
    return None
