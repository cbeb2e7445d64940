"""L1: the input check, before any 200 — system prompt, every turn, tool results, and the text
inside base64/hex-looking blobs (a common wrapper for banned requests: "decode this and do it").

Synchronous and cheap (one translate + one hyperscan scan per text; tens of µs for a few KB):
it runs on the event loop before the request is admitted.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Sequence

from sluice.safety.normalize import Normalized
from sluice.safety.patterns import Match, PatternSet

_B64 = re.compile(r"[A-Za-z0-9+/_-]{16,}={0,2}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){8,}")
MAX_BLOBS = 32  # per text: bounded work on hostile input
MAX_BLOB_CHARS = 65536
MAX_DEPTH = 2  # base64 inside base64


def _printable(data: bytes) -> str | None:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    # text, not binary: no control characters (invisible format characters are fine — they are
    # exactly what a disguised phrase carries, and normalization strips them)
    return text if all(c.isprintable() or c.isspace() or unicodedata.category(c) == "Cf" for c in text) else None


def _candidates(text: str):
    """(offset, run) for each run of base64 alphabet characters ≥ 16 long. Splitting on
    whitespace first (C speed) and regex-matching only long tokens is ~10× faster than running
    the regexes over the whole text, where most positions start a short failed attempt."""
    pos = 0
    for token in text.split():
        pos = text.find(token, pos)
        if len(token) >= 16:
            for m in _B64.finditer(token):
                yield pos + m.start(), m.group(0)
        pos += len(token)


def decoded_blobs(text: str) -> list[tuple[int, int, str]]:
    """(start, end, decoded text) for each blob in `text` that decodes to printable UTF-8."""
    out: list[tuple[int, int, str]] = []
    for start, raw in _candidates(text):
        raw = raw[:MAX_BLOB_CHARS]
        hexed = _HEX.fullmatch(raw)
        if hexed:
            data: bytes | None = bytes.fromhex(raw)
        else:
            body = raw.rstrip("=")
            try:
                data = base64.b64decode(
                    body + "=" * (-len(body) % 4), altchars=b"-_" if ("-" in raw or "_" in raw) else None, validate=True
                )
            except (binascii.Error, ValueError):
                data = None
        decoded = _printable(data) if data else None
        if decoded:
            out.append((start, start + len(raw), decoded))
            if len(out) >= MAX_BLOBS:
                break
    return out


def _scan_blobs(patterns: PatternSet, text: str, depth: int) -> tuple[Match, int, int] | None:
    for start, end, decoded in decoded_blobs(text):
        text_n = Normalized(decoded).text
        m = patterns.scan(text_n) or patterns.scan_spaced(text_n)
        if m is None and depth < MAX_DEPTH:
            inner = _scan_blobs(patterns, decoded, depth + 1)
            m = inner[0] if inner else None
        if m is not None:
            return m, start, end
    return None


def check_texts(patterns: PatternSet, texts: Sequence[str]) -> tuple[Match, int, int, int] | None:
    """The first banned match across `texts`: (match, part index, original start, original end).
    A match inside a decoded blob reports the blob's span and a rule suffixed ":decoded"."""
    for part, text in enumerate(texts):
        if not text:
            continue
        norm = Normalized(text)
        m = patterns.scan(norm.text) or patterns.scan_spaced(norm.text)
        if m is not None:
            start, end = norm.span(m.start, m.end)
            return m, part, start, end
        found = _scan_blobs(patterns, text, 1)
        if found is not None:
            m, start, end = found
            return Match(m.category, m.rule + ":decoded", m.start, m.end), part, start, end
    return None
