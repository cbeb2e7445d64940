"""The gateway end to end: real `sluice serve` processes (sharing one real worker), real Redis,
keys made with the CLI, the official SDKs as clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
import pytest

from tests.server_process import MODEL, free_port, start_server, start_worker

pytestmark = pytest.mark.slow
ASK = [{"role": "user", "content": "Say one word."}]


@pytest.fixture(scope="module")
def worker():
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-gw-')) / 'w.sock'}"
    proc = start_worker(address, ["--max-num-seqs", "16"])
    proc.extra["address"] = address
    yield proc
    proc.stop()


def make_key(data_dir: Path, tenant: str, tier: str, *flags: str) -> str:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sluice.cli",
            "keys",
            "create",
            "--tenant",
            tenant,
            "--tier",
            tier,
            *flags,
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.strip()


def gateway(worker, data_dir: Path, **env: str):
    return start_server(["--worker", worker.extra["address"]], env={"SLUICE_DATA_DIR": str(data_dir), **env})


def metric_value(base_url: str, name: str, labels: str = "") -> float:
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[1])
    return 0.0


def test_keys_rate_limits_across_two_gateways_and_headers(worker, redis_server, tmp_path):
    key = make_key(tmp_path, "acme", "standard", "--rpm", "50", "--max-concurrent", "1000")
    env = {"SLUICE_LIMITS_STORE": "redis", "SLUICE_REDIS_URL": redis_server.url, "SLUICE_KEY_CACHE_TTL_S": "0.5"}
    a, b = gateway(worker, tmp_path, **env), gateway(worker, tmp_path, **env)
    try:
        body = {"model": MODEL, "max_tokens": 1, "messages": ASK}

        async def burst(url: str, n: int) -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=200)) as c:
                return await asyncio.gather(
                    *(c.post(url + "/v1/messages", json=body, headers={"x-api-key": key}) for _ in range(n))
                )

        async def both() -> list[httpx.Response]:
            ra, rb = await asyncio.gather(burst(a.base_url, 100), burst(b.base_url, 100))
            return ra + rb

        t0 = time.monotonic()
        responses = asyncio.run(both())
        elapsed = time.monotonic() - t0
        codes = [r.status_code for r in responses]
        # 50 at once, plus what the bucket refilled (50 per minute) while a busy machine served
        # the burst: still far below the 2 × (50 + refill) that two unshared limiters would allow
        refilled = int(elapsed * 50 / 60) + 1
        assert set(codes) == {200, 429} and 50 <= codes.count(200) <= 50 + refilled, (codes.count(200), elapsed)
        limited = next(r for r in responses if r.status_code == 429)
        assert limited.json()["error"]["type"] == "rate_limit_error"
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.headers["anthropic-ratelimit-requests-remaining"] == "0"
        ok = next(r for r in responses if r.status_code == 200)
        assert ok.headers["anthropic-ratelimit-requests-limit"] == "50"
        assert ok.headers["anthropic-ratelimit-output-tokens-reset"].endswith("Z")

        wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
        assert httpx.post(a.base_url + "/v1/messages", json=body, headers={"x-api-key": wrong}).status_code == 401
        key_id = (
            subprocess.run(
                [sys.executable, "-m", "sluice.cli", "keys", "list", "--data-dir", str(tmp_path)],
                capture_output=True,
                text=True,
            )
            .stdout.splitlines()[1]
            .split()[0]
        )
        subprocess.run(
            [sys.executable, "-m", "sluice.cli", "keys", "revoke", key_id, "--data-dir", str(tmp_path)], check=True
        )
        deadline = time.monotonic() + 60  # revocation takes effect within key_cache_ttl_s (0.5 s here)
        while (r := httpx.post(a.base_url + "/v1/messages", json=body, headers={"x-api-key": key})).status_code != 401:
            assert time.monotonic() < deadline, r.status_code
            time.sleep(0.2)
        assert r.json()["error"]["type"] == "authentication_error"
    finally:
        a.stop()
        b.stop()
    for proc in (a, b):
        assert key not in proc.log() and wrong not in proc.log()  # keys never reach the logs


async def _ask(c: httpx.AsyncClient, url: str, key: str, tag: str, finished: dict[str, float]) -> int:
    """One short request; when it finished goes in `finished` under `tag`."""
    r = await c.post(
        url + "/v1/messages",
        headers={"x-api-key": key},
        json={"model": MODEL, "max_tokens": 6, "messages": ASK, "temperature": 0.7},
    )
    finished[tag] = time.monotonic()
    return r.status_code


async def _queue_depth(probe: httpx.AsyncClient, url: str) -> float:
    text = (await probe.get(url + "/metrics")).text
    return next(float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("sluice_gateway_queue_depth "))


async def _low_queue_then_high(url: str, low: str, high: str) -> tuple[dict[str, float], list[int]]:
    """50 low-tier requests, then, once over 30 of them queue, one high-tier request: when
    each finished, and every status."""
    finished: dict[str, float] = {}
    # one client: creating 50 (each builds an SSL context) would itself take a second or two
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=100)) as c:
        tasks = [asyncio.create_task(_ask(c, url, low, f"low{i}", finished)) for i in range(50)]
        async with httpx.AsyncClient() as probe:
            for _ in range(100):  # the engine slots are busy and low-tier work is queued
                await asyncio.sleep(0.05)
                depth = await _queue_depth(probe, url)
                if depth > 30:
                    break
        assert depth > 30
        tasks.append(asyncio.create_task(_ask(c, url, high, "high", finished)))
        return finished, await asyncio.gather(*tasks)


async def _burst(url: str, key: str) -> list[httpx.Response]:
    """60 requests at once, each willing to queue for 2 s."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=100)) as c:
        return await asyncio.gather(
            *(
                c.post(
                    url + "/v1/messages",
                    headers={"x-api-key": key, "sluice-queue-timeout": "2"},
                    json={"model": MODEL, "max_tokens": 200, "messages": ASK, "temperature": 0.7},
                )
                for _ in range(60)
            )
        )


def test_priority_overtakes_and_burst_sheds_cleanly(worker, tmp_path):
    low = make_key(
        tmp_path,
        "bulk",
        "free",
        "--rpm",
        "10000",
        "--itpm",
        "10000000",
        "--otpm",
        "10000000",
        "--max-concurrent",
        "1000",
    )
    high = make_key(tmp_path, "vip", "priority")
    # a long queue deadline for the low tier: on a loaded machine 50 queued requests take a while,
    # and this test is about order and completion, not about shedding (that is the burst below)
    server = gateway(
        worker,
        tmp_path,
        SLUICE_MAX_INFLIGHT="2",
        SLUICE_MAX_QUEUED_TOKENS="20000",
        SLUICE_TIERS='{"free": {"queue_deadline_s": 600}}',
    )
    try:
        finished, codes = asyncio.run(_low_queue_then_high(server.base_url, low, high))
        assert all(c == 200 for c in codes)  # no starvation: every low-tier request completed too
        later_low = sum(1 for k, t in finished.items() if k.startswith("low") and t > finished["high"])
        assert later_low >= 30, f"only {later_low} low requests finished after the high one"

        # a burst of 10x what fits: only 200 / 429 / 529, each refusal with retry-after, no 5xx, no
        # hang (each request's client timeout is 120 s: a hang fails there, whatever the machine's speed)
        responses = asyncio.run(_burst(server.base_url, low))
        codes = [r.status_code for r in responses]
        assert set(codes) <= {200, 429, 529} and codes.count(529) > 0 and codes.count(200) > 0, codes
        for r in responses:
            if r.status_code != 200:
                assert "retry-after" in r.headers and r.json()["error"]["type"] in (
                    "overloaded_error",
                    "rate_limit_error",
                )
            else:
                assert r.json()["stop_reason"] in ("end_turn", "max_tokens")
        # the SDK's own retry on 529 then succeeds
        client = anthropic.Anthropic(base_url=server.base_url, api_key=low, max_retries=3)
        assert client.messages.create(model=MODEL, max_tokens=2, messages=ASK).stop_reason is not None
    finally:
        server.stop()


def test_coalescing_identical_requests(worker, tmp_path):
    key_a = make_key(tmp_path, "acme", "standard")
    key_b = make_key(tmp_path, "globex", "standard")
    server = gateway(worker, tmp_path)
    try:
        body = {
            "model": MODEL,
            "max_tokens": 40,
            "stream": True,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Describe a quiet harbor at dawn."}],
        }

        async def one(key: str, stop_after: int | None = None) -> str:
            text = ""
            async with httpx.AsyncClient(timeout=120) as c:
                async with c.stream(
                    "POST", server.base_url + "/v1/messages", json=body, headers={"x-api-key": key}
                ) as r:
                    assert r.status_code == 200
                    n = 0
                    async for line in r.aiter_lines():
                        if line.startswith("data: ") and '"text_delta"' in line:
                            import json

                            text += json.loads(line[6:])["delta"]["text"]
                            n += 1
                            if stop_after is not None and n >= stop_after:
                                return text
            return text

        engine_before = metric_value(server.base_url, "sluice_gateway_requests_total", '{kind="engine"}')

        async def run() -> list[str]:
            return await asyncio.gather(*[one(key_a) for _ in range(17)], *[one(key_a, stop_after=2) for _ in range(3)])

        texts = asyncio.run(run())
        full = texts[:17]
        assert len(set(full)) == 1 and len(full[0]) > 20  # identical complete replies
        assert all(full[0].startswith(t) for t in texts[17:])  # the cancelled ones got a prefix
        engine_after = metric_value(server.base_url, "sluice_gateway_requests_total", '{kind="engine"}')
        coalesced = metric_value(server.base_url, "sluice_gateway_requests_total", '{kind="coalesced"}')
        assert engine_after - engine_before == 1 and coalesced == 19

        async def two_tenants() -> tuple[str, str]:
            return await asyncio.gather(one(key_a), one(key_b))

        asyncio.run(two_tenants())
        assert metric_value(server.base_url, "sluice_gateway_requests_total", '{kind="engine"}') - engine_after == 2
    finally:
        server.stop()


def test_redis_down_fails_closed_with_529_not_500(worker, tmp_path):
    key = make_key(tmp_path, "acme", "standard")
    server = gateway(
        worker,
        tmp_path,
        SLUICE_LIMITS_STORE="redis",
        SLUICE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        SLUICE_ON_STORE_ERROR="closed",
    )
    try:
        r = httpx.post(
            server.base_url + "/v1/messages",
            json={"model": MODEL, "max_tokens": 2, "messages": ASK},
            headers={"x-api-key": key},
            timeout=30,
        )
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error" and "retry-after" in r.headers
    finally:
        server.stop()
    assert "rate-limit store unavailable" in server.log()


def test_queued_streams_ping_and_leaving_clients_leave_the_queue(worker, tmp_path):
    server = gateway(worker, tmp_path, SLUICE_MAX_INFLIGHT="1", SLUICE_PING_INTERVAL_S="0.3")
    import threading

    from httpx_sse import connect_sse

    stop = threading.Event()

    def occupy() -> None:  # holds the only engine slot until told to stop
        # ignore_eos and ~8k tokens: the story cannot end on its own before the test tells it to,
        # however fast the machine (400 tokens that could end at an EOS did, on a quick run)
        story = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper and her cat."}]
        body = {
            "model": MODEL,
            "max_tokens": 8000,
            "stream": True,
            "messages": story,
            "temperature": 0,
            "ignore_eos": True,
        }
        with (
            httpx.Client(timeout=120) as c,
            connect_sse(c, "POST", server.base_url + "/v1/chat/completions", json=body) as es,
        ):
            for _ in es.iter_sse():
                if stop.is_set():
                    return

    def depth() -> float:
        return metric_value(server.base_url, "sluice_gateway_queue_depth")

    holder = threading.Thread(target=occupy)
    holder.start()
    try:
        deadline = time.monotonic() + 60
        while metric_value(server.base_url, "sluice_gateway_inflight_requests") < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        body = {"model": MODEL, "max_tokens": 5, "stream": True, "messages": ASK}
        names: list[str] = []
        queued_while_pinging = 0.0
        with httpx.Client(timeout=30) as c, connect_sse(c, "POST", server.base_url + "/v1/messages", json=body) as es:
            t0 = time.monotonic()
            for sse in es.iter_sse():
                names.append(sse.event)
                if names.count("ping") == 5:
                    queued_while_pinging = depth()
                if time.monotonic() - t0 > 2.5:
                    break  # leaving the iterator closes the connection: the client is gone
        assert queued_while_pinging == 1
        assert "message_start" not in names and names.count("ping") >= 5  # pings while it waits in the queue
        t0 = time.monotonic()
        while depth() != 0:  # the client left: so did its queue entry (long before its deadline)
            assert time.monotonic() - t0 < 20
            time.sleep(0.05)
        with pytest.raises(httpx.ReadTimeout):  # a non-streaming request whose client gives up while queued
            httpx.post(server.base_url + "/v1/messages", json={**body, "stream": False}, timeout=1.0)
        t0 = time.monotonic()
        while depth() != 0:
            assert time.monotonic() - t0 < 20
            time.sleep(0.05)
    finally:
        stop.set()
        holder.join(60)
        server.stop()
