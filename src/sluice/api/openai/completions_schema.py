"""OpenAI's legacy completions request body (`POST /v1/completions`) as a pydantic model.

`prompt` is one text, a list of texts, a list of token ids, or a list of token-id lists (each
text or id list is a prompt of its own; the reply has `n` choices per prompt). `logprobs` is an
integer here (the number of alternatives per token), not chat's boolean.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from sluice.api.openai.schema import StreamOptions
from sluice.api.wire_types import ChoiceCount, Count, JsonInt, LogprobCount, Seed

MAX_CHOICES = 16  # n, and prompts × n, per request


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    prompt: str | list[str] | list[JsonInt] | list[list[JsonInt]]
    max_tokens: Count | None = 16  # OpenAI's default; 0 with echo: score the prompt only; null: the window's rest
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: Count | None = None  # not OpenAI's; vLLM-compatible extension
    ignore_eos: bool = False  # not OpenAI's; vLLM / llama.cpp extension: generate max_tokens whatever EOS says
    n: JsonInt = Field(1, ge=1, le=MAX_CHOICES)
    best_of: ChoiceCount | None = None  # only best_of == n (no ranking)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    echo: bool = False  # the prompt's text (and, with logprobs, its tokens' logprobs) first
    logprobs: LogprobCount | None = None
    suffix: str | None = None  # refused unless null (no insertion)
    # accepted for compatibility; not applied by this engine (documented in docs/API.md)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
