"""Incremental detokenization with stop sequences.

Text is released only when it is final: a token that ends inside a UTF-8 character yields
nothing until the character completes (tokenizers' DecodeStream), and the tail of the text that
could still be the beginning of a stop sequence is held back until it either completes the
stop (then it is cut, never sent) or stops matching. Special tokens are not rendered.
"""

from __future__ import annotations

import tokenizers
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    __slots__ = ("backend", "stream", "stops", "max_stop", "text", "emitted", "stop_matched")

    def __init__(self, backend: tokenizers.Tokenizer, stop: tuple[str, ...] = (), prompt_tail: list[int] | None = None):
        self.backend = backend
        self.stream = DecodeStream(skip_special_tokens=True)
        if prompt_tail:
            # Prime with the last prompt tokens so the first output token decodes in context
            # (e.g. a leading space after an assistant prefill); their text is not emitted.
            for token_id in prompt_tail:
                self.stream.step(backend, token_id)
        self.stops = stop
        self.max_stop = max((len(s) for s in stop), default=0)
        self.text = ""
        self.emitted = 0
        self.stop_matched: str | None = None

    def resume(self, output_ids: list[int], delivered_chars: int) -> None:
        """Replay output tokens generated elsewhere, of which `delivered_chars` characters of
        text were already sent: their text is not emitted again, and what the other side still
        held back (a partial stop sequence, half a character) is emitted from here on."""
        for token_id in output_ids:
            self.add_token(token_id)
        self.emitted = min(delivered_chars, len(self.text))

    def add_token(self, token_id: int) -> None:
        """Append one generated token; sets `stop_matched` (and cuts the text) on a stop."""
        piece = self.stream.step(self.backend, token_id)
        if not piece:
            return
        before = len(self.text)
        self.text += piece
        if not self.stops:
            return
        search_from = max(0, before - self.max_stop + 1)
        best = -1
        for stop in self.stops:
            idx = self.text.find(stop, search_from)
            if idx != -1 and (best == -1 or idx < best):
                best, self.stop_matched = idx, stop
        if best != -1:
            self.text = self.text[:best]

    def _holdback(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop sequence."""
        text = self.text
        for k in range(min(self.max_stop - 1, len(text) - self.emitted), 0, -1):
            tail = text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0

    def take(self, final: bool = False) -> str:
        """Text that became final since the last call (all remaining text when `final`)."""
        end = len(self.text) if (final or self.stop_matched is not None) else len(self.text) - self._holdback()
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta
