"""`POST /tokenize` and `POST /detokenize` bodies, in vLLM's shapes.

tokenize takes either `prompt` (text, tokenized as the legacy completions API does) or
`messages` (a chat, rendered through the model's template as chat completions does).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from sluice.api.openai.schema import ChatMessage
from sluice.api.wire_types import JsonInt


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True  # messages only
    add_special_tokens: bool = True  # accepted; the model's own rule (a BOS if it wants one) applies
    return_token_strs: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    tokens: list[JsonInt]
