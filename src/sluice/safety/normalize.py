"""Text normalization for matching, with a map back to the original text.

Every layer matches on normalized text, so one rule covers the spellings people use to slip past
filters:
- NFKC (fullwidth and other compatibility forms fold to ASCII), casefold, accents dropped (NFKD
  minus combining marks);
- zero-width characters, joiners, soft hyphens, bidi controls (all of Unicode category Cf) and a
  few invisible fillers removed;
- common confusables (Cyrillic/Greek look-alikes) and leetspeak digits/symbols mapped to ASCII
  letters, so "1gn0re" and "іgnоre" (Cyrillic і, о) both read "ignore";
- punctuation becomes a space and whitespace runs collapse to one space, so "how-to", "how  to"
  and "how\\nto" all read "how to". Leading whitespace is dropped; a trailing space is kept (a
  stream continues after it).

Normalization is per character (plus one bit of state: "the last output was a space"), which is
what lets the stream guard normalize deltas incrementally and get exactly the text that
normalizing the whole reply at once gives. Each normalized character records the index of the
original character it came from (`src`), so verdicts report offsets in the original text.
Consequence for policy authors: regexes see lowercase words of letters separated by single
spaces (digits read as letters), not the raw text.

Letter-spaced text ("b.o.m.b", "b o m b", "b-0-m-b" all normalize to "b o m b") is a separate
view: `squeeze_spaced` joins each run of three or more single-letter words, with a map back to
the normalized text. L1 and L4 scan that view too (a whole-text check; the stream guard does not:
letter-spaced output is caught by the post-check before the stream's stop).
"""

from __future__ import annotations

import re
import unicodedata

# Invisible letters that are not category Cf (which is stripped wholesale): Hangul fillers,
# Mongolian/Khmer vowel fillers, combining grapheme joiner.
_INVISIBLE_EXTRA = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u3164\uffa0")

CONFUSABLES = {
    # Cyrillic look-alikes
    "а": "a",
    "в": "b",
    "е": "e",
    "ё": "e",
    "к": "k",
    "м": "m",
    "н": "h",
    "о": "o",
    "р": "p",
    "с": "c",
    "т": "t",
    "у": "y",
    "х": "x",
    "і": "i",
    "ї": "i",
    "ј": "j",
    "ѕ": "s",
    "һ": "h",
    "ԁ": "d",
    "ԛ": "q",
    "ԝ": "w",
    "ɡ": "g",
    "ӏ": "l",
    "ь": "b",
    # Greek look-alikes
    "α": "a",
    "β": "b",
    "ε": "e",
    "η": "n",
    "ι": "i",
    "κ": "k",
    "ν": "v",
    "ο": "o",
    "ρ": "p",
    "τ": "t",
    "υ": "u",
    "χ": "x",
    "γ": "y",
    "ω": "w",
    "ς": "s",
    "σ": "s",
    "μ": "u",
    "ϲ": "c",
    # Latin look-alikes outside ASCII
    "ı": "i",
    "ɩ": "i",
    "ʟ": "l",
    "ɑ": "a",
}
# Leetspeak: digits and symbols commonly standing for letters. Applied to all text (matching
# only; the original is what is sent), so digits never appear in normalized text.
LEET = {"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "@": "a", "$": "s", "!": "i"}


def _ascii_table() -> dict[int, str]:
    table = {}
    for code in range(128):
        ch = chr(code)
        if ch in LEET:
            table[code] = LEET[ch]
        elif ch.isspace() or (not ch.isalnum() and ch.isprintable()):
            table[code] = " "  # punctuation separates words
        else:
            table[code] = ch.lower()
    return table


_ASCII = _ascii_table()
_FOLD_CACHE: dict[str, str] = {chr(c): s for c, s in _ASCII.items()}
_SPACES = re.compile(r" {2,}")
_NON_ASCII = re.compile(r"([^\x00-\x7f]+)")


class _FoldTable(dict):
    """`str.translate` table: code point → fold_char, computed on first sight. translate runs
    its loop in C, so whole texts normalize at ~C speed whatever their script."""

    def __missing__(self, code: int) -> str:
        out = fold_char(chr(code))
        if len(self) < 65536:
            self[code] = out
        return out


_TABLE = _FoldTable(_ASCII)


def fold_char(ch: str) -> str:
    """One original character → its normalized characters (may be "", one, or several)."""
    out = _FOLD_CACHE.get(ch)
    if out is not None:
        return out
    if ch in _INVISIBLE_EXTRA or unicodedata.category(ch) == "Cf":
        out = ""
    elif ch.isspace():
        out = " "
    else:
        parts = []
        for c in unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", ch).casefold()):
            if unicodedata.combining(c) or unicodedata.category(c) == "Cf":
                continue
            c = CONFUSABLES.get(c, c)
            if c in _FOLD_CACHE and ord(c) < 128:
                parts.append(_ASCII[ord(c)])
            elif c.isspace() or unicodedata.category(c)[0] in "PZ":
                parts.append(" ")
            else:
                parts.append(c)
        out = "".join(parts)
    if len(_FOLD_CACHE) < 65536:  # bounded: a hostile stream of distinct code points cannot grow it
        _FOLD_CACHE[ch] = out
    return out


class Normalizer:
    """Normalizes text fed in pieces. `text`/`src` accumulate unless `keep=False` (the stream
    guard keeps its own bounded tail and only needs what each piece adds)."""

    __slots__ = ("_parts", "src", "consumed", "_last_space", "keep")

    def __init__(self, keep: bool = True) -> None:
        self._parts: list[str] = []
        self.src: list[int] = []  # original index of each normalized char (when keep)
        self.consumed = 0  # original characters seen
        self._last_space = True  # leading whitespace is dropped
        self.keep = keep

    def feed(self, piece: str) -> tuple[str, list[int]]:
        """Normalize `piece`: the normalized characters it added, and their original indices."""
        base = self.consumed
        if piece.isascii():  # the common token: one translate, no per-character loop
            folded = piece.translate(_TABLE)  # ASCII folds 1:1
            if folded and "  " not in folded and not (self._last_space and folded[0] == " "):
                self._last_space = folded[-1] == " "
                self.consumed += len(piece)
                src = list(range(base, base + len(piece)))
                if self.keep:
                    self._parts.append(folded)
                    self.src.extend(src)
                return folded, src
        added: list[str] = []
        src = []
        last_space = self._last_space
        for i, ch in enumerate(piece):
            for c in fold_char(ch):
                if c == " ":
                    if last_space:
                        continue
                    last_space = True
                else:
                    last_space = False
                added.append(c)
                src.append(base + i)
        self._last_space = last_space
        self.consumed += len(piece)
        out = "".join(added)
        if self.keep:
            self._parts.append(out)
            self.src.extend(src)
        return out, src

    @property
    def text(self) -> str:
        if len(self._parts) > 1:
            self._parts = ["".join(self._parts)]
        return self._parts[0] if self._parts else ""


class Normalized:
    """A normalized text and the way back to its original. The text comes from one `translate`
    and one regex (the per-character fold, whitespace collapsed — exactly what `Normalizer`
    produces, tested); the character map is built only when a verdict needs offsets, which is
    rare."""

    __slots__ = ("original", "text", "_src")

    def __init__(self, original: str) -> None:
        self.original = original
        self._src: list[int] | None = None
        if original.isascii():
            folded = original.translate(_TABLE)
        else:  # ASCII runs take translate's ASCII fast path; the rest goes through the table
            folded = "".join(run.translate(_TABLE) for run in _NON_ASCII.split(original))
        self.text = _SPACES.sub(" ", folded).lstrip(" ")

    @property
    def src(self) -> list[int]:
        if self._src is None:
            n = Normalizer()
            n.feed(self.original)
            self._src = n.src
        return self._src

    def span(self, start: int, end: int) -> tuple[int, int]:
        """Normalized [start, end) → original [start, end)."""
        src = self.src
        if not src or start >= end:
            return 0, 0
        return src[start], src[end - 1] + 1


_SPACED_RUN = re.compile(r"(?<![^ ])[a-z](?: [a-z](?![^ ])){2,}")


def spaced_runs(text: str) -> list[tuple[int, int]]:
    """[start, end) of each run of ≥ 3 single-letter words in normalized `text`."""
    return [m.span() for m in _SPACED_RUN.finditer(text)]


def squeeze_spaced(text: str, runs: list[tuple[int, int]]) -> tuple[str, list[int]]:
    """Normalized `text` with each letter-spaced run (from `spaced_runs`) joined into one word,
    and per character of the result its index in `text`."""
    parts: list[str] = []
    index: list[int] = []
    pos = 0
    for start, end in runs:
        parts.append(text[pos:start])
        index.extend(range(pos, start))
        parts.append(text[start:end:2])  # the letters; the spaces between them sit at odd offsets
        index.extend(range(start, end, 2))
        pos = end
    parts.append(text[pos:])
    index.extend(range(pos, len(text)))
    return "".join(parts), index


def normalize(text: str) -> tuple[str, list[int]]:
    """Normalized text and, per normalized character, its index in `text`."""
    n = Normalized(text)
    return n.text, n.src
