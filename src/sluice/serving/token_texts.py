"""Each token id's text and bytes under a version's tokenizer, for the wire formats that show
tokens (OpenAI's logprobs): built once per tokenizer and kept (a gateway serves a few models)."""

from __future__ import annotations

from sluice.models.token_text import TokenText
from sluice.models.tokenizer import Tokenizer

__all__ = ["TokenText", "Tokenizer", "token_text"]

_texts: dict[int, tuple[Tokenizer, TokenText]] = {}  # id(tokenizer) → its token texts


def token_text(tokenizer: Tokenizer) -> TokenText:
    held = _texts.get(id(tokenizer))
    if held is None or held[0] is not tokenizer:
        held = _texts[id(tokenizer)] = (tokenizer, TokenText(tokenizer.backend))
    return held[1]
