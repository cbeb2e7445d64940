"""The router's HTTP client for the shard query path (stats and search requests) and the health
poller's status reads: keep-alive HTTP/1.1 connections on asyncio, responses parsed by httptools.

Why not aiohttp (which this was) nor httpx: measured against one shard process, one keep-alive
JSON POST cost the router ~0.24 ms of CPU with aiohttp (tuning it — prebuilt URLs, fewer
headers — changed nothing: the cost is its request/response machinery) and ~0.08 ms over a bare
asyncio protocol, and a query makes one or two per shard (docs/SEARCH.md, "Performance").
The parsing is not ours: httptools (llhttp, uvicorn's parser, already installed with it) reads
status, headers, content-length or chunked bodies; what is here is the connection pool and
the rules that keep it safe:

- one connection carries one request at a time and goes back to the pool only after its whole
  answer was read and the answer allows keep-alive; after an error, a timeout or a
  cancellation (a lost hedge) it is aborted, never pooled, so a late answer can never be read
  by the next request (tests/unit/search/test_fast_paths.py checks that);
- a pooled connection the replica closed as it was taken (no answer byte came) is retried once
  on a fresh connection (these are reads); a refused connection is not (failover's job);
- idle connections are dropped after KEEPALIVE_S, below uvicorn's keep-alive (5 s), so the
  pool lets go of an idle connection before the shard does; at most `max_connections` requests
  are in flight per router;
- TCP_NODELAY on every connection (a request is one write, but the answer must not wait for
  a delayed ACK either).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httptools

KEEPALIVE_S = 4.0
MAX_IDLE_PER_REPLICA = 64


class ShardQueryError(Exception):
    """The replica could not be reached or its answer was not HTTP/JSON (failover material)."""


class ShardQueryTimeout(ShardQueryError):
    pass


class _Lost(Exception):
    """The connection closed or broke before the whole answer came."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection: a request written, its answer parsed into `waiter`."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future | None = None
        self.chunks: list[bytes] = []
        self.answered = False  # a byte of the current answer arrived
        self.keep_alive = True
        self.closed = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_Lost(f"a malformed HTTP answer ({exc})"))
            self.close()

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        body, self.chunks = b"".join(self.chunks), []
        self.keep_alive = self.parser.should_keep_alive()
        if waiter is None or waiter.done():
            self.close()  # an answer nobody asked for: this connection cannot be trusted
            return
        waiter.set_result((self.parser.get_status_code(), body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(_Lost(f"{type(exc).__name__}: {exc}" if exc else "closed by the replica"))

    def _fail(self, exc: BaseException) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _LoopState:
    """The pool of one event loop (connections belong to the loop that opened them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_connections: int):
        self.loop = loop
        self.idle: dict[tuple[str, int], deque[_Connection]] = {}
        self.slots = asyncio.Semaphore(max_connections)


class ShardQueryClient:
    def __init__(self, max_connections: int = 512):
        self._max = max_connections
        self._state: _LoopState | None = None
        self._targets: dict[str, tuple[tuple[str, int], bytes, bytes, str]] = {}

    def _here(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            self._state = _LoopState(loop, self._max)
        return self._state

    def _target(self, url: str) -> tuple[tuple[str, int], bytes, bytes, str]:
        """(host, port), a POST's head up to its content length, the whole GET request, and
        "host:port" for messages, once per URL."""
        got = self._targets.get(url)
        if got is None:
            u = urlsplit(url)
            if u.scheme != "http" or not u.hostname:
                raise ShardQueryError(f"{url}: only http:// replica URLs are supported")
            port = u.port or 80
            where = f"{u.hostname}:{port}"
            path = (u.path or "/") + (f"?{u.query}" if u.query else "")
            head = (
                f"POST {path} HTTP/1.1\r\nhost: {u.netloc}\r\ncontent-type: application/json\r\ncontent-length: "
            ).encode()
            get = f"GET {path} HTTP/1.1\r\nhost: {u.netloc}\r\n\r\n".encode()
            got = self._targets[url] = ((u.hostname, port), head, get, where)
            if len(self._targets) > 4096:  # replicas come and go (hot shards): never grow unbounded
                self._targets.clear()
        return got

    async def post_json(self, url: str, payload: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any]]:
        """POST `payload` as JSON to `url`; (status, the JSON answer). ShardQueryTimeout after
        timeout_s, ShardQueryError when the replica is unreachable or its answer malformed."""
        key, head, _, where = self._target(url)
        body = json.dumps(payload, separators=(",", ":")).encode()
        return await self._json(key, where, b"%s%d\r\n\r\n%s" % (head, len(body), body), timeout_s)

    async def get_json(self, url: str, timeout_s: float) -> tuple[int, dict[str, Any]]:
        """GET `url` (the health poller's status reads: ~1 ms of CPU less than httpx's a read);
        as post_json."""
        key, _, get, where = self._target(url)
        return await self._json(key, where, get, timeout_s)

    async def _json(
        self, key: tuple[str, int], where: str, request: bytes, timeout_s: float
    ) -> tuple[int, dict[str, Any]]:
        st = self._here()
        loop = st.loop
        deadline = loop.time() + max(0.001, timeout_s)
        if st.slots.locked():
            try:
                await asyncio.wait_for(st.slots.acquire(), max(0.001, deadline - loop.time()))
            except TimeoutError:
                raise ShardQueryTimeout(f"no connection to {where} free within {timeout_s:.3f}s") from None
        else:
            await st.slots.acquire()
        try:
            status, data = await self._exchange(st, key, where, request, deadline, timeout_s)
        finally:
            st.slots.release()
        try:
            out = json.loads(data) if data else {}
        except ValueError:
            raise ShardQueryError(f"{where}: an answer that is not JSON") from None
        if not isinstance(out, dict):
            raise ShardQueryError(f"{where}: an answer that is not a JSON object")
        return status, out

    async def _exchange(
        self, st: _LoopState, key: tuple[str, int], where: str, request: bytes, deadline: float, timeout_s: float
    ) -> tuple[int, bytes]:
        loop = st.loop
        for attempt in (1, 2):
            conn = self._pooled(st, key, loop.time())
            reused = conn is not None
            if conn is None:
                conn = await self._connect(loop, key, where, deadline, timeout_s)
            waiter = conn.waiter = loop.create_future()
            conn.answered = False
            if conn.closed:  # lost while it was being opened
                waiter.set_exception(_Lost("closed by the replica"))
            timer = loop.call_later(max(0.0, deadline - loop.time()), _expire, waiter)
            try:
                conn.transport.write(request)  # type: ignore[union-attr]
                status, data = await waiter
            except _Lost as exc:
                conn.close()
                if reused and attempt == 1 and not conn.answered:
                    continue  # the replica closed this idle connection as it was taken: once more, fresh
                raise ShardQueryError(f"{where}: {exc}"[:300]) from None
            except TimeoutError:
                conn.close()
                raise ShardQueryTimeout(f"no answer from {where} within {timeout_s:.3f}s") from None
            except BaseException:  # cancelled (a lost hedge) or anything else: never pooled
                conn.close()
                raise
            finally:
                timer.cancel()
                conn.waiter = None
            if conn.keep_alive and not conn.closed:
                conn.idle_since = loop.time()
                idle = st.idle.setdefault(key, deque())
                idle.append(conn)
                while len(idle) > MAX_IDLE_PER_REPLICA:
                    idle.popleft().close()
            else:
                conn.close()
            return status, data
        raise AssertionError("unreachable")

    @staticmethod
    def _pooled(st: _LoopState, key: tuple[str, int], now: float) -> _Connection | None:
        """The most recently used idle connection to this replica still open and fresh."""
        idle = st.idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    @staticmethod
    async def _connect(
        loop: asyncio.AbstractEventLoop, key: tuple[str, int], where: str, deadline: float, timeout_s: float
    ) -> _Connection:
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, *key), max(0.001, deadline - loop.time())
            )
        except TimeoutError:
            raise ShardQueryTimeout(f"no answer from {where} within {timeout_s:.3f}s") from None
        except OSError as exc:
            raise ShardQueryError(f"{where}: {type(exc).__name__}: {exc}"[:300]) from None
        return conn

    async def aclose(self) -> None:
        if self._state is not None:
            for idle in self._state.idle.values():
                while idle:
                    idle.pop().close()
            self._state = None
