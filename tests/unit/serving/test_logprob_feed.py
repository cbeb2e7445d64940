"""Logprobs wait for their text: a token's logprob is never released before the stream guard
releases that token's text; the rest goes with the final outcome; the prompt's with the first."""

from __future__ import annotations

from sluice.serving.outcomes import Finished, TextDelta
from sluice.serving.stages.logprob_feed import LogprobFeed
from sluice.types import FinishReason, GenerationEvent, TokenLogprob


def _lp(token: int) -> TokenLogprob:
    return TokenLogprob(token, -float(token))


def test_logprobs_follow_released_text():
    feed = LogprobFeed()
    prompt = [None, _lp(9)]
    feed.add(GenerationEvent("r", "Hel", [1], logprobs=[_lp(1)], prompt_logprobs=prompt))
    feed.add(GenerationEvent("r", "lo", [2], logprobs=[_lp(2)]))
    first = feed.attach(TextDelta("He"))  # the guard released less than the first token's text
    assert first.logprobs == [] and first.prompt_logprobs == prompt
    second = feed.attach(TextDelta("l"))
    assert [e.token_id for e in second.logprobs] == [1] and second.prompt_logprobs is None
    third = feed.attach(TextDelta("l"))
    assert third.logprobs == []  # "lo" is not all out yet
    feed.add(GenerationEvent("r", "!", [3], logprobs=[_lp(3)]))
    fourth = feed.attach(TextDelta("o"))
    assert [e.token_id for e in fourth.logprobs] == [2]
    final = feed.attach(Finished(FinishReason.EOS), everything=True)  # the guard's tail never came
    assert [e.token_id for e in final.logprobs] == [3]


def test_nothing_asked_nothing_attached():
    feed = LogprobFeed()
    feed.add(GenerationEvent("r", "Hi", [1]))
    out = feed.attach(TextDelta("Hi"))
    assert out.logprobs == [] and out.prompt_logprobs is None
