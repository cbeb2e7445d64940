"""A single token's bytes and its text, as logprobs and /tokenize show it.

A token is a piece of bytes, not always whole characters (byte-level BPE splits a multi-byte
character across tokens). Its bytes are exact: a byte-level vocabulary maps each piece's
characters back to bytes (GPT-2's byte ↔ unicode table), a SentencePiece one spells raw bytes
as `<0xNN>` and spaces as `▁`. Its text is those bytes decoded, with U+FFFD for a partial
character (what OpenAI and vLLM show; the bytes field keeps the truth).
"""

from __future__ import annotations

import builtins
import functools
import re

import tokenizers
from tokenizers import decoders

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's table: every byte has a printable stand-in character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenText:
    """Bytes and text of token ids for one tokenizer (cached per id: vocabularies are fixed)."""

    def __init__(self, backend: tokenizers.Tokenizer):
        self.backend = backend
        self.byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        self._cache: dict[int, bytes] = {}
        # the ids a decode with skip_special_tokens leaves out (as generated text does)
        self.specials = frozenset(i for i, t in backend.get_added_tokens_decoder().items() if t.special)

    def bytes(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._bytes(token_id)
        return cached

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")

    # builtins.bytes: inside the class, `bytes` names the method above
    def shown_bytes(self, token_id: int, skip_specials: bool) -> builtins.bytes:
        """What the token adds to a text decoded with or without its special tokens."""
        return b"" if skip_specials and token_id in self.specials else self.bytes(token_id)

    def _bytes(self, token_id: int) -> builtins.bytes:
        piece = self.backend.id_to_token(token_id)
        if piece is None:
            return b""
        if self.byte_level:
            table = _byte_decoder()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        m = _BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        if not self.byte_level and "▁" in piece:
            return piece.replace("▁", " ").encode()
        return self.backend.decode([token_id], skip_special_tokens=False).encode()
