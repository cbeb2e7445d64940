"""`POST /v1/completions`, `n` on both OpenAI endpoints, and `/tokenize` / `/detokenize`,
against a real `sluice serve` (the official `openai` SDK where it has the call)."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch

from tests.server_process import MODEL
from tests.system.api.conftest import SHARED_KEY

pytestmark = pytest.mark.slow
KEY = SHARED_KEY
H = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(shared_server):
    return shared_server  # tests/system/api/conftest.py: the bundled model behind KEY


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)


def _tokenize(server, text: str) -> list[int]:
    return httpx.post(server.base_url + "/tokenize", json={"model": MODEL, "prompt": text}, headers=H).json()["tokens"]


def test_text_and_token_prompts_agree(client, server):
    text = "The capital of France is"
    by_text = client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0)
    ids = _tokenize(server, text)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert by_text.object == "text_completion" and by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids) and by_text.usage.completion_tokens == 6
    assert by_text.choices[0].finish_reason == "length" and by_text.choices[0].logprobs is None
    many = client.completions.create(model=MODEL, prompt=[text, "One, two,"], max_tokens=3, temperature=0, n=2)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == by_text.choices[0].text[: len(many.choices[0].text)]
    assert many.choices[2].text == many.choices[3].text != many.choices[0].text
    stopped = client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0, stop=["."])
    assert stopped.choices[0].finish_reason == "stop" and "." not in stopped.choices[0].text


def test_echo_scores_the_prompt_like_transformers(client, server, hf_bundled):
    """How harnesses score a continuation: max_tokens 0, echo, logprobs."""
    ids = _tokenize(server, "Question: what color is the sky? Answer: blue")
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=0, echo=True, logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    assert r.choices[0].text == "Question: what color is the sky? Answer: blue" and r.usage.completion_tokens == 0
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[1] == len(lp.tokens[0])
    with torch.no_grad():
        ref = torch.log_softmax(hf_bundled(torch.tensor([ids])).logits[0].float(), -1)
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(ref[i - 1, ids[i]]), abs=2e-3)
        assert lp.tokens[i] in lp.top_logprobs[i] and max(lp.top_logprobs[i].values()) == pytest.approx(
            float(ref[i - 1].max()), abs=2e-3
        )
    # max_tokens 1 (lm-evaluation-harness's request): the same prompt scores, one more token
    one = client.completions.create(model=MODEL, prompt=ids, max_tokens=1, echo=True, logprobs=1, temperature=0)
    assert one.choices[0].logprobs.token_logprobs[: len(ids)] == lp.token_logprobs
    assert len(one.choices[0].logprobs.tokens) == len(ids) + 1


def test_streaming_matches_the_whole_reply(client):
    kwargs = dict(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2, echo=True)
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == full.choices[0].logprobs.tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]


def test_n_choices_with_derived_seeds(client):
    messages = [{"role": "user", "content": "Tell me a one-line story."}]
    a = client.chat.completions.create(model=MODEL, messages=messages, n=3, temperature=1.0, seed=11, max_tokens=8)
    b = client.chat.completions.create(model=MODEL, messages=messages, n=3, temperature=1.0, seed=11, max_tokens=8)
    texts = [c.message.content for c in a.choices]
    assert [c.index for c in a.choices] == [0, 1, 2] and texts == [c.message.content for c in b.choices]
    assert len(set(texts)) > 1  # each choice draws with its own seed
    single = client.chat.completions.create(model=MODEL, messages=messages, temperature=1.0, seed=11, max_tokens=8)
    assert single.choices[0].message.content == texts[0]  # choice 0 keeps the request's seed
    assert 3 <= a.usage.completion_tokens <= 24  # every choice's output
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, n=3, temperature=1.0, seed=11, max_tokens=8, stream=True
        )
    )
    streamed = [
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
        for i in range(3)
    ]
    assert streamed == texts
    legacy = client.completions.create(model=MODEL, prompt="Once", n=2, temperature=1.0, seed=5, max_tokens=6)
    assert len(legacy.choices) == 2


def test_tokenize_and_detokenize(server):
    r = httpx.post(
        server.base_url + "/tokenize",
        json={"model": MODEL, "prompt": "Hello world", "return_token_strs": True},
        headers=H,
    ).json()
    assert r["count"] == len(r["tokens"]) == 2 and r["token_strs"] == ["Hello", " world"] and r["max_model_len"] > 0
    chat = httpx.post(
        server.base_url + "/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}, headers=H
    ).json()
    assert chat["count"] > 3
    back = httpx.post(server.base_url + "/detokenize", json={"model": MODEL, "tokens": r["tokens"]}, headers=H).json()
    assert back == {"prompt": "Hello world"}
    bad = httpx.post(server.base_url + "/detokenize", json={"model": MODEL, "tokens": [10**7]}, headers=H)
    assert bad.status_code == 400 and "outside the vocabulary" in bad.json()["error"]["message"]
    assert httpx.post(server.base_url + "/tokenize", json={"model": MODEL, "prompt": "x"}).status_code == 401
    assert (
        httpx.post(server.base_url + "/tokenize", json={"model": "nope", "prompt": "x"}, headers=H).status_code == 404
    )


def test_bad_completions_requests(client):
    for kwargs, word in (
        (dict(prompt=[10**7]), "vocabulary"),
        (dict(prompt="x", suffix="y"), "suffix"),
        (dict(prompt=["a"] * 9, n=2), "choices"),
        (dict(prompt="x", logprobs=21), "logprobs"),
        (dict(prompt=""), "empty"),
    ):
        with pytest.raises(openai.BadRequestError, match=word):
            client.completions.create(model=MODEL, max_tokens=2, **kwargs)


SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")


def _assert_offsets_walk_the_text(text: str, lp, start: int = 0) -> None:
    """`text_offset[i]` is where token i starts in `text`: the offsets step by what each token
    adds to the text (a special token the text skips adds nothing) and never pass its end."""
    shown = [t for t in lp.tokens if t not in SPECIALS]
    assert all(o <= len(text) for o in lp.text_offset)
    steps = [0 if t in SPECIALS else len(t) for t in lp.tokens]
    assert lp.text_offset == [start + sum(steps[:i]) for i in range(len(steps))]
    assert "".join(shown) == text[start:]


def test_text_offsets_skip_the_special_tokens_the_text_skips(client):
    """With ignore_eos the model writes past <|im_end|>: the text leaves the special tokens out,
    so their 10 characters must not move the offsets (they ran past the text's end)."""
    prompt = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    kwargs = dict(model=MODEL, prompt=prompt, max_tokens=48, temperature=0, logprobs=1, extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs)
    lp = full.choices[0].logprobs
    assert any(t in SPECIALS for t in lp.tokens), lp.tokens  # the case under test happened
    assert len(lp.tokens) == full.usage.completion_tokens == 48
    _assert_offsets_walk_the_text(full.choices[0].text, lp)
    # echoed, the prompt's specials are in the text (it is the prompt as sent): they count there
    echoed = client.completions.create(echo=True, **kwargs)
    elp, etext = echoed.choices[0].logprobs, echoed.choices[0].text
    n_prompt = echoed.usage.prompt_tokens
    assert etext.startswith(prompt) and "".join(elp.tokens[:n_prompt]) == prompt
    assert elp.text_offset[:n_prompt] == [sum(len(t) for t in elp.tokens[:i]) for i in range(n_prompt)]
    assert elp.text_offset[n_prompt:] == [len(prompt) + o for o in lp.text_offset]
    # streamed, each chunk's offsets continue where the text so far has got to
    chunks = list(client.completions.create(stream=True, **kwargs))
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text and offsets == lp.text_offset
