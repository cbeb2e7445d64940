"""OpenAI chat completions against a real `sluice serve`, with the official `openai` SDK."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.server_process import MODEL
from tests.system.api.conftest import SHARED_KEY

pytestmark = pytest.mark.slow
KEY = SHARED_KEY


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/system/api/conftest.py: the bundled model behind KEY


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]


def test_non_streaming_and_streaming_agree(client):
    full = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=16)
    choice = full.choices[0]
    assert full.id.startswith("chatcmpl") and full.object == "chat.completion"
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert (
        full.usage.completion_tokens > 0
        and full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            temperature=0,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    no_usage = list(
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=4, stream=True)
    )
    assert all(c.usage is None for c in no_usage)


def test_stop_and_length(client):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=2)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    base = (
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count from 1 to 10 separated by commas."}],
            temperature=0,
            max_tokens=40,
        )
        .choices[0]
        .message.content
    )
    assert "4" in base
    stopped = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from 1 to 10 separated by commas."}],
        temperature=0,
        max_tokens=40,
        stop=["4"],
    ).choices[0]
    assert (
        stopped.finish_reason == "stop"
        and "4" not in stopped.message.content
        and base.startswith(stopped.message.content)
    )


def test_errors_in_openai_shape(server, client):
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=MESSAGES)
    assert info.value.body["code"] == "model_not_found" if isinstance(info.value.body, dict) else True
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body={"bogus": 1})
    assert "bogus" in str(info.value)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=17)
    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=MESSAGES)
    r = httpx.post(
        server.base_url + "/v1/chat/completions", content=b"{oops", headers={"authorization": f"Bearer {KEY}"}
    )
    body = r.json()
    assert r.status_code == 400 and set(body["error"]) == {"message", "type", "param", "code"}
