"""Logprobs held until their text is released.

The engine reports a token's logprob with the token; the stream guard may hold that token's
text back (it could begin a banned phrase). A logprob names its token, so it must not reach the
client before the text does: each engine event's logprobs wait until the text released so far
covers that event's text, and whatever is left goes out with the final outcome (a refusal drops
them with the text). The prompt's logprobs go out with the first outcome.
"""

from __future__ import annotations

from collections import deque

from sluice.serving.outcomes import Finished, TextDelta
from sluice.types import GenerationEvent, TokenLogprob


class LogprobFeed:
    def __init__(self) -> None:
        self._pending: deque[tuple[int, list[TokenLogprob]]] = deque()  # (engine text end, logprobs)
        self._engine_chars = 0
        self._released_chars = 0
        self._prompt: list[TokenLogprob | None] | None = None

    def add(self, ev: GenerationEvent) -> None:
        self._engine_chars += len(ev.text)
        if ev.logprobs:
            self._pending.append((self._engine_chars, ev.logprobs))
        if ev.prompt_logprobs is not None:
            self._prompt = ev.prompt_logprobs

    def attach(self, outcome: TextDelta | Finished, everything: bool = False) -> TextDelta | Finished:
        """Give `outcome` the logprobs its text (all, for a final outcome) releases."""
        if isinstance(outcome, TextDelta):
            self._released_chars += len(outcome.text)
        while self._pending and (everything or self._pending[0][0] <= self._released_chars):
            outcome.logprobs.extend(self._pending.popleft()[1])
        if self._prompt is not None:
            outcome.prompt_logprobs, self._prompt = self._prompt, None
        return outcome
