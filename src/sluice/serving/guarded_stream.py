"""The safety layers around one generation, as both wire formats consume them.

`guarded()` turns engine events into `Piece`s: text that is safe to send, then either the final
event or a refusal. It runs
- L2: the classifier on the request's input, started with the generation; the first content
  waits for it at most `deadline_ms` past the start, after which it acts as an async killer;
- L3: the stream guard (hold back only what could still become a banned literal) and, every
  `check_every_chars`, the classifier on the recent window (async);
- L4: the post-check on the finished text before the stop is sent.
Returning after a refusal closes the engine stream, which aborts the request at once.
"""

from __future__ import annotations


import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.verdict import Verdict, log_verdict
from sluice.types import FinishReason, GenerationEvent, Usage

EXPLANATIONS = {
    "L2": "The request was classified as violating the usage policy.",
    "L3": "The response was stopped because it began to violate the usage policy.",
    "L4": "The response violated the usage policy.",
}


@dataclass(slots=True)
class Piece:
    text: str = ""
    final: GenerationEvent | None = None
    refusal: Verdict | None = None
    usage: Usage | None = None


def stop_details(v: Verdict) -> dict:
    return {"type": "refusal", "category": v.category, "explanation": EXPLANATIONS.get(v.layer, "policy violation")}


async def guarded(
    safety: SafetyPipeline | None,
    events: AsyncIterator[GenerationEvent],
    input_text: str,
    request_id: str,
    on_verdict=None,
) -> AsyncIterator[Piece]:
    try:
        async for piece in _guarded(safety, events, input_text, request_id, on_verdict):
            yield piece
    finally:  # however this ends (refusal, disconnect), close the engine stream now: that aborts
        await _close(events)


async def _close(events: AsyncIterator[GenerationEvent]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


async def _guarded(
    safety: SafetyPipeline | None,
    events: AsyncIterator[GenerationEvent],
    input_text: str,
    request_id: str,
    on_verdict=None,
) -> AsyncIterator[Piece]:
    if safety is None:
        async for ev in events:
            if ev.text:
                yield Piece(text=ev.text, usage=ev.usage)
            if ev.finished:
                yield Piece(final=ev, usage=ev.usage)
                return
        return
    loop = asyncio.get_running_loop()
    settings = safety.policy.classifier
    guard = safety.stream_guard()
    l2 = None
    if safety.classifier is not None and input_text:
        l2 = asyncio.ensure_future(safety.classify(input_text, "L2"))
    gate_until = loop.time() + settings.deadline_ms / 1000
    window: asyncio.Future | None = None
    next_check = settings.check_every_chars

    async def found(v: Verdict, usage: Usage) -> Piece:
        # abort first: the refusal's events are written after this returns, and the engine
        # must not spend another step on a killed request meanwhile
        await _close(events)
        log_verdict(v, request_id, guard.text_so_far if safety.policy.log_text else None)
        if on_verdict is not None:
            on_verdict(v)
        return Piece(refusal=v, usage=usage)

    try:
        async for ev in events:
            text, verdict = guard.feed(ev.text) if ev.text else ("", None)
            if verdict is None and l2 is not None:
                if text and not l2.done():  # the first content waits for L2, up to the deadline
                    await asyncio.wait({l2}, timeout=max(0.0, gate_until - loop.time()))
                if l2.done():
                    verdict, l2 = l2.result(), None
            if verdict is None and window is not None and window.done():
                verdict, window = window.result(), None
            if verdict is not None:
                yield await found(verdict, ev.usage)
                return
            if text:
                yield Piece(text=text, usage=ev.usage)
            if next_check and guard.released >= next_check and window is None and safety.classifier is not None:
                window = asyncio.ensure_future(
                    safety.classify(guard.text_so_far[-settings.window_chars :], "L3", output=True)
                )
                next_check = guard.released + settings.check_every_chars
            if ev.finished:
                if ev.finish_reason in (FinishReason.ABORT, FinishReason.ERROR):
                    yield Piece(final=ev, usage=ev.usage)
                    return
                tail, verdict = guard.finish()
                if verdict is None and l2 is not None:
                    verdict = await l2  # a short reply may end before L2 answered: it still decides
                    l2 = None
                if verdict is None:
                    verdict = safety.post_check(guard.text_so_far)
                if verdict is not None:
                    yield await found(verdict, ev.usage)
                    return
                if tail:
                    yield Piece(text=tail, usage=ev.usage)
                yield Piece(final=ev, usage=ev.usage)
                return
    finally:
        for task in (l2, window):
            if task is not None and not task.done():
                task.cancel()
