"""Chat completions' logprobs against a real `sluice serve`, with the official `openai` SDK:
OpenAI's shape, streamed and not, the same values both ways."""

from __future__ import annotations

import openai
import pytest

from tests.server_process import MODEL
from tests.system.api.conftest import SHARED_KEY

pytestmark = pytest.mark.slow
KEY = SHARED_KEY
MESSAGES = [{"role": "user", "content": "Name three colors."}]


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/system/api/conftest.py: the bundled model behind KEY


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)


def test_chat_logprobs_shape_and_stream_agree(client):
    full = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3
    )
    choice = full.choices[0]
    content = choice.logprobs.content
    assert len(content) == full.usage.completion_tokens - (choice.finish_reason == "stop")
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert bytes(t.bytes).decode() == t.token and t.logprob <= 0
        assert len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == t.logprob  # greedy
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3, stream=True
        )
    )
    streamed = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, t.logprob) for t in streamed] == [(t.token, t.logprob) for t in content]
    for c in chunks:  # each chunk's logprobs are its own text's tokens
        if c.choices and c.choices[0].logprobs and c.choices[0].delta.content:
            assert "".join(t.token for t in c.choices[0].logprobs.content) == c.choices[0].delta.content


def test_logprobs_only_when_asked(client):
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None
    bare = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=4, logprobs=True)
    assert all(t.top_logprobs == [] for t in bare.choices[0].logprobs.content)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, top_logprobs=2)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, logprobs=True, top_logprobs=21)


def test_sampled_tokens_report_the_models_logprob(client):
    """A hot temperature changes which tokens are drawn, not how the model scores them: the same
    tokens scored greedily (as a prefix) carry the same logprobs."""
    hot = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=1.5, seed=3, max_tokens=6, logprobs=True
    )
    cold = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=1, logprobs=True)
    first_hot, first_cold = hot.choices[0].logprobs.content[0], cold.choices[0].logprobs.content[0]
    if first_hot.token == first_cold.token:
        assert first_hot.logprob == pytest.approx(first_cold.logprob, abs=1e-5)
    assert all(t.logprob <= 0 for t in hot.choices[0].logprobs.content)


def test_a_stop_sequences_tokens_are_cut_with_its_text(client):
    """The tokens that spell a matched stop sequence are not in the content, nor in its logprobs."""
    messages = [{"role": "user", "content": "Count from 1 to 10 separated by commas."}]
    kwargs = dict(model=MODEL, messages=messages, temperature=0, max_tokens=40, stop=["4"], logprobs=True)
    full = client.chat.completions.create(**kwargs)
    assert full.choices[0].finish_reason == "stop" and "4" not in full.choices[0].message.content
    tokens = [t.token for t in full.choices[0].logprobs.content]
    assert "".join(tokens) == full.choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    streamed = [t.token for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert streamed == tokens
