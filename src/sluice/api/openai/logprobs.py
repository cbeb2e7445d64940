"""Logprobs in OpenAI's two wire shapes.

- chat completions: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob,
  bytes}]}], "refusal": null}`, one entry per output token;
- legacy completions: `{tokens, token_logprobs, top_logprobs, text_offset}`, parallel lists
  over (echoed prompt +) output tokens; `top_logprobs` maps token text → logprob; the first
  prompt token has no logprob (null), as in OpenAI's and vLLM's answers.

The values are the engine's: the model's log-softmax before sampling shaped it (types.py).
The end-of-sequence token that ends a chat reply is not part of its content, so chat leaves its
entry out; the legacy shape keeps every token (harnesses count on one entry per token).
"""

from __future__ import annotations

import codecs
from typing import Any

from sluice.serving.token_texts import Tokenizer, TokenText, token_text
from sluice.types import TokenLogprob


def chat_content(
    entries: list[TokenLogprob], tokenizer: Tokenizer, ended_by_eos: bool, text_bytes: int | None = None
) -> list[dict[str, Any]]:
    """`text_bytes`: the UTF-8 length of the content these entries spell; tokens past it (a stop
    sequence's, cut from the text) are left out, as the text leaves them out."""
    if ended_by_eos and entries and entries[-1].token_id in tokenizer.eos_token_ids:
        entries = entries[:-1]
    tt = token_text(tokenizer)
    if text_bytes is not None:
        kept, used = [], 0
        for e in entries:
            if used >= text_bytes:
                break
            kept.append(e)
            used += len(tt.bytes(e.token_id))
        entries = kept

    def one(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": tt.text(token_id), "logprob": logprob, "bytes": list(tt.bytes(token_id))}

    return [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]} for e in entries]


def chat_logprobs(entries: list[TokenLogprob], tokenizer: Tokenizer, ended_by_eos: bool, text: str) -> dict[str, Any]:
    return {"content": chat_content(entries, tokenizer, ended_by_eos, len(text.encode())), "refusal": None}


class TextOffsets:
    """Where each next token starts in a text, token by token.

    A token advances the text by what it adds to it, not by its own text: a special token adds
    nothing to generated text (the detokenizer skips it) though its `tokens` entry reads
    `<|im_end|>`; a token that ends inside a UTF-8 character adds that character once it is
    whole (a token inside it starts where the character does). So the count is of characters
    decoded from the tokens' bytes, which is how the text itself was made."""

    def __init__(self, start: int, skip_specials: bool):
        self.chars = start
        self.skip_specials = skip_specials
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, tt: TokenText, token_id: int) -> int:
        """The offset of `token_id`, which then moves the cursor past it."""
        at = self.chars
        self.chars += len(self._decoder.decode(tt.shown_bytes(token_id, self.skip_specials)))
        return at


def legacy_logprobs(
    token_ids: list[int], entries: list[TokenLogprob | None], tokenizer: Tokenizer, offsets: TextOffsets, end: int
) -> dict[str, Any]:
    """Parallel lists for `token_ids` (`entries[i]` scores token i; None: the first prompt
    token, which nothing precedes). `offsets`: where each token starts in the choice's text, of
    which `end` characters are written so far (a token a stop sequence cut from the text starts
    at its end). Like vLLM, `top_logprobs` holds the chosen token too, so it is never empty
    (harnesses compare the chosen logprob with the best one there to tell a greedy continuation)."""
    tt = token_text(tokenizer)
    tokens: list[str] = []
    values: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    starts: list[int] = []
    for token_id, e in zip(token_ids, entries):
        text = tt.text(token_id)
        tokens.append(text)
        starts.append(min(offsets.advance(tt, token_id), end))
        if e is None:
            values.append(None)
            tops.append(None)
            continue
        values.append(e.logprob)
        top = {tt.text(t): v for t, v in e.top}
        top.setdefault(text, e.logprob)
        tops.append(top)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": starts}
