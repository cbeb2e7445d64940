"""The sampling fields both OpenAI endpoints share (temperature, top_p, top_k, seed, stop, ignore_eos), read one way.

Chat completions and legacy completions carry the same five fields with the same defaults
(OpenAI's: temperature 1, top_p 1; top_k is vLLM's extension, 0 = off); their Sampling is
built here once, with the stop sequences checked, so the two endpoints cannot drift apart.
"""

from __future__ import annotations

from typing import Protocol

from sluice.api.errors import bad_request
from sluice.types import Sampling


class SamplingFields(Protocol):
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    stop: str | list[str] | None
    ignore_eos: bool


def sampling_of(body: SamplingFields, *, logprobs: int | None, prompt_logprobs: int | None = None) -> Sampling:
    """The client's sampling choices; a 400 naming `stop` when a stop sequence is empty."""
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if any(not s for s in stop):
        raise bad_request("stop: stop sequences must be non-empty strings", param="stop")
    return Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=body.top_k or 0,
        seed=body.seed,
        stop=tuple(stop),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
