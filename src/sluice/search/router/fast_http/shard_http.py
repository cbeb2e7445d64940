"""The router's HTTP client for the shard query path (stats and search requests), on aiohttp.

Why aiohttp here and httpx elsewhere: measured on this machine, one keep-alive JSON POST to a
shard costs ~1.5 ms of router CPU with httpx.AsyncClient and ~0.4 ms with aiohttp, and a
two-phase query over 2 shards makes 4 of them (docs/SEARCH.md, "Performance"). Writes, health
polls and catch-ups are rarer and stay on httpx.

One aiohttp session per router (created in the loop that first uses it): a keep-alive pool per
replica (TCPConnector), TCP_NODELAY (aiohttp sets it on every connection it opens), a total
timeout per request (ClientTimeout). A connection is never reused after an error or a
cancellation: aiohttp closes it — not releases it to the pool — when the send, the header read
or the body read raises anything, CancelledError included (ClientSession._request and
ClientResponse.read close on BaseException), so the late answer of a lost hedge can never be
read by the next request. tests/unit/search/test_fast_paths.py checks that.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

# below uvicorn's keep-alive (5 s), so the pool drops an idle connection before the shard does
KEEPALIVE_S = 4.0


class ShardHttpError(Exception):
    """The replica could not be reached or its answer was not HTTP/JSON (failover material)."""


class ShardHttpTimeout(ShardHttpError):
    pass


class ShardHttp:
    def __init__(self, max_connections: int = 512):
        self._max = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop:
            # timeout_ceil_threshold: aiohttp rounds a timeout over 5 s up to a whole second of
            # loop time by default; a shard's deadline is kept as given
            connector = aiohttp.TCPConnector(limit=self._max, keepalive_timeout=KEEPALIVE_S,
                                             timeout_ceil_threshold=float("inf"))
            # auto_decompress off and no cookie handling: the shards answer plain JSON
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  cookie_jar=aiohttp.DummyCookieJar())
            self._loop = loop
        return self._session

    async def post_json(self, url: str, payload: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any]]:
        """POST `payload` as JSON to `url`; (status, the JSON answer). ShardHttpTimeout after
        timeout_s, ShardHttpError when the replica is unreachable or its answer malformed."""
        session = self._session_here()
        body = json.dumps(payload, separators=(",", ":")).encode()
        deadline = time.monotonic() + max(0.001, timeout_s)
        for attempt in (1, 2):
            timeout = aiohttp.ClientTimeout(total=max(0.001, deadline - time.monotonic()))
            try:
                async with session.post(url, data=body, timeout=timeout,
                                        headers={"content-type": "application/json"}) as resp:
                    data = await resp.read()
                    status = resp.status
                break
            except TimeoutError:  # aiohttp's own timeouts subclass it too
                raise ShardHttpTimeout(f"no answer from {_where(url)} within {timeout_s:.3f}s") from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # a pooled connection the replica closed as it was taken: once more on a fresh one
                # (these are reads; aiohttp retries only idempotent methods itself). A refused
                # connection (ClientConnectorError) is not retried: that is failover's job.
                if attempt == 2 or isinstance(exc, aiohttp.ClientConnectorError):
                    raise ShardHttpError(f"{_where(url)}: {type(exc).__name__}: {exc}"[:300]) from None
            except (aiohttp.ClientError, OSError) as exc:
                raise ShardHttpError(f"{_where(url)}: {type(exc).__name__}: {exc}"[:300]) from None
        try:
            out = json.loads(data) if data else {}
        except ValueError:
            raise ShardHttpError(f"{_where(url)}: an answer that is not JSON") from None
        if not isinstance(out, dict):
            raise ShardHttpError(f"{_where(url)}: an answer that is not a JSON object")
        return status, out

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _where(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]
