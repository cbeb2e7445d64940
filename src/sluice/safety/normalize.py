"""Text normalization for matching, with a map back to the original text.

Every layer matches on normalized text: NFKC, casefold, zero-width and bidi controls removed,
common confusables (Cyrillic/Greek look-alikes, leetspeak) mapped to ASCII, whitespace runs
collapsed to one space. `Normalizer` works incrementally (a stream arrives in deltas) and
records, for each normalized character, the index of the original character it came from, so
verdicts report offsets in the original text and the stream guard knows how much original text
a held-back normalized tail covers.
"""

from __future__ import annotations

import unicodedata

# zero-width characters, joiners, soft hyphen, BOM, and bidi embedding/override/isolate controls
INVISIBLE = frozenset(
    "\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u200b\u200c\u200d\u200e\u200f"
    "\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\u206a\u206b"
    "\u206c\u206d\u206e\u206f\u3164\ufeff\uffa0"
)

CONFUSABLES = {
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "і": "i", "ї": "i", "ј": "j", "ѕ": "s", "һ": "h", "ԁ": "d", "ԛ": "q",
    "ԝ": "w", "ɡ": "g",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t",
    "υ": "u", "χ": "x", "γ": "y", "ω": "w", "ς": "s", "σ": "s",
    # leetspeak and symbols
    "0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s", "!": "i",
}


def _fold(ch: str) -> str:
    out = unicodedata.normalize("NFKC", ch).casefold()
    return "".join(CONFUSABLES.get(c, c) for c in unicodedata.normalize("NFKD", out) if not unicodedata.combining(c))


class Normalizer:
    """Feeds original text in pieces; `text` and `src` grow with every piece."""

    def __init__(self) -> None:
        self.text_parts: list[str] = []
        self.src: list[int] = []  # original index of each normalized char
        self.consumed = 0  # original characters seen
        self._last_space = True  # leading whitespace is dropped

    def feed(self, piece: str) -> str:
        """Normalize `piece`; returns the normalized characters it added."""
        added: list[str] = []
        base = self.consumed
        for i, ch in enumerate(piece):
            if ch in INVISIBLE:
                continue
            if ch.isspace():
                if not self._last_space:
                    added.append(" ")
                    self.src.append(base + i)
                    self._last_space = True
                continue
            for c in _fold(ch):
                if c.isspace():
                    if self._last_space:
                        continue
                    self._last_space = True
                else:
                    self._last_space = False
                added.append(c)
                self.src.append(base + i)
        self.consumed += len(piece)
        out = "".join(added)
        self.text_parts.append(out)
        return out

    @property
    def text(self) -> str:
        if len(self.text_parts) > 1:
            self.text_parts = ["".join(self.text_parts)]
        return self.text_parts[0] if self.text_parts else ""


def normalize(text: str) -> tuple[str, list[int]]:
    n = Normalizer()
    n.feed(text)
    return n.text, n.src
