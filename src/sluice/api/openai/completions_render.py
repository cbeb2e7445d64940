"""Pipeline outcomes → OpenAI's legacy completion objects (`text_completion`), JSON or SSE.

Choices are indexed prompt × n + j. With `echo` a choice's text starts with its prompt (and its
logprobs with the prompt's tokens, the first of them null). `max_tokens: 0` computes the prompt
only: the engine's one token is not reported (text, logprobs and usage leave it out).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from sse_starlette import ServerSentEvent

from sluice.api.errors import openai_error_type
from sluice.api.openai.logprobs import TextOffsets, legacy_logprobs
from sluice.api.openai.render import FINISH, error_event, usage_object
from sluice.serving.choices import merged
from sluice.serving.errors import ServingError
from sluice.serving.outcomes import Failed, Finished, Refused, TextDelta
from sluice.serving.pipeline import Collected, Generation
from sluice.types import TokenLogprob, Usage


class ChoiceView:
    """What rendering one choice needs: its generation, index and echo."""

    def __init__(self, gen: Generation, index: int, echo: bool):
        self.gen, self.index, self.echo = gen, index, echo
        p = gen.prepared
        self.asked = p.generation.sampling.logprobs is not None
        self.scores_only = p.request.prefill_only
        self.tokenizer = p.tokenizer
        self.prompt_ids = p.generation.prompt_token_ids
        raw = p.request.raw_prompt
        self.prompt_text = (
            raw if isinstance(raw, str) else self.tokenizer.decode(self.prompt_ids, skip_special_tokens=False)
        )
        self.written = len(self.prompt_text) if echo else 0  # characters of the choice's text so far
        # generated text skips special tokens; the echoed prompt is the prompt as sent, with them
        self.output_offsets = TextOffsets(self.written, skip_specials=True)

    def echoed(self, prompt_logprobs: list[TokenLogprob | None] | None) -> tuple[str, dict[str, Any] | None]:
        lps = None
        if self.asked:
            entries = prompt_logprobs or [None] * len(self.prompt_ids)
            offsets = TextOffsets(0, skip_specials=False)
            lps = legacy_logprobs(self.prompt_ids, entries, self.tokenizer, offsets, len(self.prompt_text))
        return self.prompt_text, lps

    def output(self, text: str, entries: list[TokenLogprob]) -> tuple[str, dict[str, Any] | None]:
        """`text` and the tokens it completes (a token is reported once its text is sent, so each
        starts within the text written so far)."""
        if self.scores_only:
            text, entries = "", []
        self.written += len(text)
        lps = None
        if self.asked:
            lps = legacy_logprobs(
                [e.token_id for e in entries], list(entries), self.tokenizer, self.output_offsets, self.written
            )
        return text, lps

    def usage(self, u: Usage) -> Usage:
        return Usage(u.prompt_tokens, 0 if self.scores_only else u.output_tokens, u.cached_tokens)


def _join(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None or b is None:
        return a or b
    return {k: a[k] + b[k] for k in a}


def _finish(final: Finished | Refused) -> str:
    return "content_filter" if isinstance(final, Refused) else FINISH[final.reason]


def total_usage(views: list[ChoiceView], usages: list[Usage], first_of_prompt: list[bool]) -> dict[str, Any]:
    """The prompt counted once per prompt (its choices share it), the outputs of every choice."""
    total = Usage()
    for view, u, first in zip(views, usages, first_of_prompt):
        u = view.usage(u)
        if first:
            total.prompt_tokens += u.prompt_tokens
            total.cached_tokens += u.cached_tokens
        total.output_tokens += u.output_tokens
    return usage_object(total)


def render_completion(
    request_id: str, model: str, views: list[ChoiceView], collected: list[Collected], first_of_prompt: list[bool]
) -> dict[str, Any]:
    choices = []
    for view, c in zip(views, collected):
        if isinstance(c.final, Failed):
            raise ServingError(c.final.kind, c.final.message, retry_after_s=1.0)
        text, lps = view.output(c.text, c.logprobs)
        if view.echo:
            head, head_lps = view.echoed(c.prompt_logprobs)
            text, lps = head + text, _join(head_lps, lps)
        choices.append({"text": text, "index": view.index, "logprobs": lps, "finish_reason": _finish(c.final)})
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": total_usage(views, [c.final.usage for c in collected], first_of_prompt),
    }


async def render_chunks(
    request_id: str, model: str, views: list[ChoiceView], first_of_prompt: list[bool], include_usage: bool
) -> AsyncGenerator[ServerSentEvent, None]:
    created = int(time.time())

    def chunk(index: int, text: str, lps: dict[str, Any] | None, finish: str | None) -> ServerSentEvent:
        body: dict[str, Any] = {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"text": text, "index": index, "logprobs": lps, "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return ServerSentEvent(data=json.dumps(body, separators=(",", ":"), ensure_ascii=False))

    yield ServerSentEvent(comment="ping")
    started = [False] * len(views)
    usages: list[Usage] = [Usage() for _ in views]
    async with aclosing(merged([v.gen for v in views])) as outcomes:
        async for i, outcome in outcomes:
            view = views[i]
            if isinstance(outcome, Failed):
                yield error_event(outcome.message, openai_error_type(outcome.kind))
                return
            if view.echo and not started[i]:
                text, lps = view.echoed(getattr(outcome, "prompt_logprobs", None))
                yield chunk(view.index, text, lps, None)
            started[i] = True
            if isinstance(outcome, TextDelta):
                text, lps = view.output(outcome.text, outcome.logprobs)
                if text or (lps and lps["tokens"]):
                    yield chunk(view.index, text, lps, None)
            elif isinstance(outcome, (Finished, Refused)):
                entries = outcome.logprobs if isinstance(outcome, Finished) else []
                _, lps = view.output("", entries)
                usages[i] = outcome.usage
                yield chunk(view.index, "", lps, _finish(outcome))
    if include_usage:
        body = {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": total_usage(views, usages, first_of_prompt),
        }
        yield ServerSentEvent(data=json.dumps(body, separators=(",", ":")))
    yield ServerSentEvent(data="[DONE]")
