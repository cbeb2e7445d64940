"""Logprob requests and results cross the worker protocol unchanged (fp32 values exactly)."""

from __future__ import annotations

import struct

from sluice.types import GenerationEvent, GenerationRequest, SamplingParams, TokenLogprob
from sluice.worker.convert import event_from_pb, event_to_pb, request_from_pb, request_to_pb


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def test_sampling_asks_cross_unchanged():
    for logprobs, prompt in ((None, None), (0, None), (None, 0), (5, 20)):
        req = GenerationRequest("r", [1, 2], SamplingParams(logprobs=logprobs, prompt_logprobs=prompt))
        back = request_from_pb(request_to_pb(req)).sampling
        assert (back.logprobs, back.prompt_logprobs) == (logprobs, prompt)


def test_event_logprobs_cross_unchanged():
    lp = TokenLogprob(7, _f32(-0.125), ((7, _f32(-0.125)), (3, _f32(-2.3))))
    ev = GenerationEvent("r", "x", [7], logprobs=[lp], prompt_logprobs=[None, TokenLogprob(9, _f32(-4.1))])
    back = event_from_pb("r", event_to_pb(ev))
    assert back.logprobs == [lp]
    assert back.prompt_logprobs == ev.prompt_logprobs


def test_no_logprobs_stays_none():
    back = event_from_pb("r", event_to_pb(GenerationEvent("r", "x", [7])))
    assert back.logprobs == [] and back.prompt_logprobs is None
