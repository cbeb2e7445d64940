"""The safety layers around one generation, turning engine events into outcomes.

`guarded()` yields `TextDelta`s that are safe to send and ends with exactly one final outcome:
`Finished`, `Refused` or `Failed`. It runs
- L2: the classifier on the request's input, started with the generation; the first content
  waits for it at most `deadline_ms` past the start, after which it acts as an async killer;
- L3: the stream guard (hold back only what could still become a banned literal) and, every
  `check_every_chars`, the classifier on the recent window (async);
- L4: the post-check on the finished text before the stop is sent.
A refusal closes the engine stream before the refusal is yielded, so the engine does not spend
another step on a killed request while the renderer writes the refusal.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.verdict import Layer, Verdict
from sluice.safety.verdict_log import log_verdict
from sluice.serving.errors import ErrorKind
from sluice.serving.outcomes import Failed, Finished, Outcome, Refused, TextDelta
from sluice.serving.stages.logprob_feed import LogprobFeed
from sluice.types import FinishReason, GenerationEvent, Usage

EXPLANATIONS = {
    Layer.L2: "The request was classified as violating the usage policy.",
    Layer.L3: "The response was stopped because it began to violate the usage policy.",
    Layer.L4: "The response violated the usage policy.",
}
_NORMAL_ENDS = (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP_SEQUENCE, FinishReason.CONTEXT)


def final_outcome(ev: GenerationEvent) -> Finished | Failed:
    """The engine's last event as an outcome: an abort (shutdown, overload) and an engine error
    are failures, the rest are normal ends."""
    reason = ev.finish_reason
    if reason in _NORMAL_ENDS:
        assert reason is not None
        return Finished(reason, ev.stop_sequence, ev.usage)
    if reason is FinishReason.ABORT:
        return Failed(
            ErrorKind.OVERLOADED, "the request was aborted by the server (overloaded or shutting down)", ev.usage
        )
    return Failed(ErrorKind.INTERNAL, "the engine failed while generating this request", ev.usage)


def refusal(v: Verdict, usage: Usage) -> Refused:
    return Refused(v.layer.value, v.category, EXPLANATIONS.get(v.layer, "policy violation"), usage)


async def guarded(
    safety: SafetyPipeline | None,
    events: AsyncGenerator[GenerationEvent, None],
    input_text: str,
    request_id: str,
    on_verdict: Callable[[Verdict], None] | None = None,
) -> AsyncGenerator[Outcome, None]:
    async with aclosing(events):
        if safety is None:
            feed = LogprobFeed()
            async for ev in events:
                feed.add(ev)
                if ev.text:
                    yield feed.attach(TextDelta(ev.text, ev.usage))
                if ev.finished:
                    final = final_outcome(ev)
                    yield feed.attach(final, everything=True) if isinstance(final, Finished) else final
                    return
            return
        async with aclosing(_guarded(safety, events, input_text, request_id, on_verdict)) as inner:
            async for outcome in inner:
                yield outcome


async def _guarded(
    safety: SafetyPipeline,
    events: AsyncGenerator[GenerationEvent, None],
    input_text: str,
    request_id: str,
    on_verdict: Callable[[Verdict], None] | None,
) -> AsyncGenerator[Outcome, None]:
    loop = asyncio.get_running_loop()
    settings = safety.policy.classifier
    guard = safety.stream_guard()
    l2 = None
    if safety.classifier is not None and input_text:
        l2 = asyncio.ensure_future(safety.classify(input_text, Layer.L2))
    gate_until = loop.time() + settings.deadline_ms / 1000
    window: asyncio.Future | None = None
    next_check = settings.check_every_chars
    feed = LogprobFeed()

    async def found(v: Verdict, usage: Usage) -> Refused:
        # abort first: the refusal's events are written after this returns, and the engine
        # must not spend another step on a killed request meanwhile
        await events.aclose()
        log_verdict(v, request_id, guard.text_so_far if safety.policy.log_text else None)
        if on_verdict is not None:
            on_verdict(v)
        return refusal(v, usage)

    try:
        async for ev in events:
            feed.add(ev)
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
                yield feed.attach(TextDelta(text, ev.usage))
            if next_check and guard.released >= next_check and window is None and safety.classifier is not None:
                window = asyncio.ensure_future(
                    safety.classify(guard.text_so_far[-settings.window_chars :], Layer.L3, output=True)
                )
                next_check = guard.released + settings.check_every_chars
            if ev.finished:
                final = final_outcome(ev)
                if isinstance(final, Failed):
                    yield final
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
                    yield feed.attach(TextDelta(tail, ev.usage))
                yield feed.attach(final, everything=True)
                return
    finally:
        for task in (l2, window):
            if task is not None and not task.done():
                task.cancel()
