"""Both OpenAI endpoints read their sampling fields one way (api/openai/sampling.py), and what the
client chose reaches the engine's SamplingParams unchanged once planning adds the budget."""

from __future__ import annotations

import pytest

from sluice.api.errors import ApiError
from sluice.api.openai.completions_schema import CompletionRequest
from sluice.api.openai.sampling import sampling_of
from sluice.api.openai.schema import ChatCompletionRequest
from sluice.types import Sampling, SamplingParams

FIELDS = {"temperature": 0, "top_p": 0.5, "top_k": 5, "seed": 7, "stop": "x", "ignore_eos": True}


@pytest.mark.parametrize(
    "body",
    [
        ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **FIELDS}),
        CompletionRequest.model_validate({"model": "m", "prompt": "hi", **FIELDS}),
    ],
    ids=["chat", "completions"],
)
def test_the_clients_choices_reach_the_engine_params(body):
    chosen = sampling_of(body, logprobs=2)
    assert chosen == Sampling(temperature=0, top_p=0.5, top_k=5, seed=7, stop=("x",), ignore_eos=True, logprobs=2)
    params = SamplingParams.of(chosen, max_tokens=9)
    assert (params.ignore_eos, params.stop, params.logprobs, params.max_tokens, params.guided) == (
        True,
        ("x",),
        2,
        9,
        None,
    )


def test_openai_defaults_and_an_empty_stop_refused():
    body = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert sampling_of(body, logprobs=None) == Sampling(temperature=1.0, top_p=1.0, top_k=0, ignore_eos=False)
    bad = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": [""]}
    )
    with pytest.raises(ApiError) as info:
        sampling_of(bad, logprobs=None)
    assert info.value.status == 400 and info.value.param == "stop"
