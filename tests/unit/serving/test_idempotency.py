"""Idempotency-Key on the real ASGI app over a scripted engine (no model, no server process):
a retry gets the same response without a second generation or charge; another body is a 422; a
retry while the first runs waits for it or follows its stream; a failed first attempt frees the
key; tenants never share keys. The stores themselves: tests/system/stores/test_idempotency_store.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sluice.gateway.limits import Limits
from sluice.gateway.principal import Principal
from sluice.types import FinishReason
from tests.fake_engine import Script
from tests.fuzz_app import MODEL, scripted_app

BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}
CHAT = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Say hello."}]}


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return tiny_llama_dir


class Keys:
    """Two tenants' keys (a test authenticator), each with its own limits."""

    def __init__(self, **principals: Principal):
        self.principals = principals

    async def authenticate(self, presented_key: str | None) -> Principal | None:
        return self.principals.get(presented_key or "")


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=60)


def keyed(key: str, **headers: str) -> dict[str, str]:
    return {"Idempotency-Key": key, **headers}


async def until(condition, what: str) -> None:
    """Yield to the loop until `condition()` holds (bounded in steps, not seconds)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


async def logged(rt, stream_id: str, n: int) -> None:
    """Until the first `n` events of `stream_id` are in the replay log."""
    for _ in range(10_000):
        if await rt.replay.owner(stream_id) is not None:
            break
        await asyncio.sleep(0)
    seen = 0
    async for _ in rt.replay.follow(stream_id, 0):
        seen += 1
        if seen >= n:
            return
    raise AssertionError(f"{stream_id} ended after {seen} events")


def events(text: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    for line in text.splitlines():
        if not line:
            if cur:
                out.append(cur)
            cur = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            cur[field] = value.strip()
    return out


def content(text: str) -> list[tuple[str, str]]:
    """The numbered (replayable) events of an Anthropic stream: (id, data)."""
    return [(e["id"], e["data"]) for e in events(text) if "id" in e]


def test_a_retry_gets_the_same_reply_and_is_not_generated_again(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny)
        async with client(app) as c:
            first = await c.post("/v1/messages", json=BODY, headers=keyed("k-1"))
            again = await c.post("/v1/messages", json=BODY, headers=keyed('"k-1"'))  # the draft's sf-string form
            other = await c.post("/v1/messages", json=BODY, headers=keyed("k-2"))
            plain = await c.post("/v1/messages", json=BODY)
        assert first.status_code == again.status_code == 200
        assert again.content == first.content and again.headers["idempotent-replayed"] == "true"
        assert "idempotent-replayed" not in first.headers
        assert again.headers["request-id"] != first.headers["request-id"]  # each HTTP request has its own
        assert other.json()["id"] != first.json()["id"] and plain.status_code == 200
        assert len(engine.started) == 3  # first, k-2, unkeyed: the retry ran nothing

    asyncio.run(run())


def test_the_same_key_with_another_body_is_a_422_in_each_wire_shape(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny)
        async with client(app) as c:
            assert (await c.post("/v1/messages", json=BODY, headers=keyed("k"))).status_code == 200
            changed = await c.post("/v1/messages", json={**BODY, "max_tokens": 17}, headers=keyed("k"))
            other_route = await c.post("/v1/chat/completions", json=CHAT, headers=keyed("k"))
            bad = await c.post("/v1/messages", json=BODY, headers=keyed("x" * 256))
        assert changed.status_code == 422 and changed.headers["x-should-retry"] == "false"
        err = changed.json()["error"]
        assert err["type"] == "invalid_request_error" and err["details"]["error_code"] == "idempotency_key_reused"
        assert other_route.status_code == 422  # a key names one request: the route is part of it
        assert other_route.json()["error"]["code"] == "idempotency_key_reused"  # OpenAI's shape
        assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]["message"]
        assert len(engine.started) == 1

    asyncio.run(run())


def test_keys_are_per_tenant_and_a_retry_is_charged_once(tiny):
    async def run():
        limited = Limits(rpm=2)
        auth = Keys(a=Principal(tenant="acme", key_id="a", limits=limited), b=Principal(tenant="zeta", key_id="b"))
        app, _, engine = await scripted_app(tiny, authenticator=auth)
        async with client(app) as c:
            got = [
                await c.post("/v1/messages", json=BODY, headers=keyed("shared", **{"x-api-key": "a"})) for _ in range(4)
            ]
            theirs = await c.post("/v1/messages", json=BODY, headers=keyed("shared", **{"x-api-key": "b"}))
            second = await c.post("/v1/messages", json=BODY, headers={"x-api-key": "a"})
            third = await c.post("/v1/messages", json=BODY, headers={"x-api-key": "a"})
        assert [r.status_code for r in got] == [200] * 4 and len({r.content for r in got}) == 1
        assert theirs.status_code == 200 and theirs.json()["id"] != got[0].json()["id"]  # unrelated
        assert second.status_code == 200 and third.status_code == 429  # rpm 2: the 4 keyed cost one
        assert len(engine.started) == 3

    asyncio.run(run())


def test_a_retry_while_the_first_runs_waits_for_it(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny, Script(texts=["a", "b", "c"], hang_at=1))
        async with client(app) as c:
            first = asyncio.ensure_future(c.post("/v1/messages", json=BODY, headers=keyed("k")))
            await until(lambda: engine.started, "the first attempt generates")
            retry = asyncio.ensure_future(c.post("/v1/messages", json=BODY, headers=keyed("k")))
            for _ in range(200):
                await asyncio.sleep(0)
            assert not retry.done()  # waiting, not generating and not refused
            engine.release.set()
            a, b = await first, await retry
        assert a.status_code == b.status_code == 200 and a.content == b.content
        assert engine.started == [a.json()["id"]]

    asyncio.run(run())


def test_a_failed_first_attempt_releases_the_key(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny, Script(texts=["x"], finish=FinishReason.ABORT))
        async with client(app) as c:
            failed = await c.post("/v1/messages", json=BODY, headers=keyed("k"))
            engine.script = Script()
            # the abort took the worker out of routing (a lost worker is down until a health
            # probe finds it ready again): the retry comes once it is back
            for _ in range(600):
                if (await c.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            retried = await c.post("/v1/messages", json=BODY, headers=keyed("k"))
            again = await c.post("/v1/messages", json=BODY, headers=keyed("k"))
        assert failed.status_code == 529 and retried.status_code == 200
        assert again.content == retried.content and len(engine.started) == 2

    asyncio.run(run())


def test_a_refused_first_attempt_releases_the_key(tiny):
    async def run():
        app, rt, engine = await scripted_app(tiny)
        async with client(app) as c:
            rt.draining = True  # refused before generating: 529
            refused = await c.post("/v1/messages", json=BODY, headers=keyed("k"))
            rt.draining = False
            ok = await c.post("/v1/messages", json=BODY, headers=keyed("k"))
        assert refused.status_code == 529 and ok.status_code == 200 and len(engine.started) == 1

    asyncio.run(run())


def test_a_keyed_stream_is_replayed_from_its_record_and_resumed_after_last_event_id(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny, Script(texts=["a", "b", "c", "d"]))
        body = {**BODY, "stream": True}
        async with client(app) as c:
            first = await c.post("/v1/messages", json=body, headers=keyed("s"))
            again = await c.post("/v1/messages", json=body, headers=keyed("s"))
            whole = content(first.text)
            resumed = await c.post("/v1/messages", json=body, headers=keyed("s", **{"Last-Event-ID": whole[2][0]}))
            wrong = await c.post("/v1/messages", json=body, headers=keyed("s", **{"Last-Event-ID": "msg_other:2"}))
        assert first.headers["content-type"].startswith("text/event-stream")
        assert json.loads(whole[-1][1])["type"] == "message_stop"
        assert content(again.text) == whole and again.headers["idempotent-replayed"] == "true"
        assert content(resumed.text) == whole[3:]
        assert wrong.status_code == 400
        assert len(engine.started) == 1

    asyncio.run(run())


def test_a_retry_of_a_running_stream_follows_it_through_the_replay_log(tiny):
    async def run():
        app, rt, engine = await scripted_app(tiny, Script(texts=["a", "b", "c", "d"], hang_at=2))
        body = {**BODY, "stream": True}
        async with client(app) as c:
            first = asyncio.ensure_future(c.post("/v1/messages", json=body, headers=keyed("s")))
            await until(lambda: engine.started, "the first attempt generates")
            msg_id = engine.started[0]
            await logged(rt, msg_id, 3)
            retry = asyncio.ensure_future(
                c.post("/v1/messages", json=body, headers=keyed("s", **{"Last-Event-ID": f"{msg_id}:1"}))
            )
            for _ in range(200):
                await asyncio.sleep(0)
            assert not retry.done()  # following live
            engine.release.set()
            a, b = await first, await retry
        whole = content(a.text)
        assert content(b.text) == whole[1:] and json.loads(whole[-1][1])["type"] == "message_stop"
        assert len(engine.started) == 1

    asyncio.run(run())


def test_a_stream_that_failed_releases_its_key_and_its_followers_see_the_error(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny, Script(texts=["a", "b"], finish=FinishReason.ERROR))
        body = {**BODY, "stream": True}
        async with client(app) as c:
            failed = await c.post("/v1/messages", json=body, headers=keyed("s"))
            engine.script = Script()
            retried = await c.post("/v1/messages", json=body, headers=keyed("s"))
        assert json.loads(content(failed.text)[-1][1])["type"] == "error"
        assert json.loads(content(retried.text)[-1][1])["type"] == "message_stop"
        assert len(engine.started) == 2

    asyncio.run(run())


def test_openai_retries_replay_the_reply_and_the_stream_from_its_start(tiny):
    async def run():
        app, _, engine = await scripted_app(tiny, Script(texts=["a", "b"]))
        stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        async with client(app) as c:
            first = await c.post("/v1/chat/completions", json=CHAT, headers=keyed("c"))
            again = await c.post("/v1/chat/completions", json=CHAT, headers=keyed("c"))
            s1 = await c.post("/v1/chat/completions", json=stream, headers=keyed("cs"))
            s2 = await c.post(
                "/v1/chat/completions", json=stream, headers=keyed("cs", **{"Last-Event-ID": "ignored:3"})
            )
        assert again.content == first.content and again.json()["object"] == "chat.completion"
        chunks = [e["data"] for e in events(s1.text) if "data" in e]
        assert chunks[-1] == "[DONE]" and json.loads(chunks[-2])["usage"]["completion_tokens"] == 2
        assert [e for e in events(s2.text) if "data" in e] == [e for e in events(s1.text) if "data" in e]
        assert all("id" not in e and "event" not in e for e in events(s2.text))  # OpenAI frames, as sent
        assert len(engine.started) == 2

    asyncio.run(run())
