"""The router's HTTP/1.1 client for the shard query path (stats and search requests).

Why not httpx here: measured on this machine, one keep-alive JSON POST to a shard costs ~1.5 ms
of router CPU with httpx.AsyncClient, ~0.4 ms with aiohttp and ~0.16 ms with this client, and a
two-phase query over 2 shards makes 4 of them — the router's CPU, not the network, was most of
the distributed layer's added latency (docs/SEARCH.md, "Performance"). The shard protocol is
ours and small (JSON in, JSON out, content-length bodies from uvicorn), so a client that speaks
just that is enough: a keep-alive pool per replica, TCP_NODELAY, a timeout per request, and a
connection closed — never reused — after any error or cancellation (a lost hedge), so a late
answer can never be read by the next request. Writes, health polls and catch-ups stay on httpx.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any
from urllib.parse import urlsplit

MAX_BODY_BYTES = 256 << 20


class ShardHttpError(Exception):
    """The replica could not be reached or its answer was not HTTP/JSON (failover material)."""


class ShardHttpTimeout(ShardHttpError):
    pass


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ShardHttp:
    def __init__(self, max_idle_per_host: int = 64):
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._max_idle = max_idle_per_host

    async def post_json(self, url: str, payload: dict[str, Any], timeout_s: float) -> tuple[int, dict[str, Any]]:
        """POST `payload` as JSON to `url`; (status, the JSON answer). ShardHttpTimeout after
        timeout_s, ShardHttpError when the replica is unreachable or its answer malformed."""
        parts = urlsplit(url)
        key = (parts.hostname or "127.0.0.1", parts.port or 80)
        body = json.dumps(payload, separators=(",", ":")).encode()
        head = (f"POST {parts.path or '/'} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()
        try:
            async with asyncio.timeout(max(0.001, timeout_s)):
                conn = self._take(key)
                if conn is not None:
                    try:
                        return await self._exchange(key, conn, head + body)
                    except (ConnectionError, asyncio.IncompleteReadError):
                        pass  # the replica closed the idle connection: once more on a fresh one
                return await self._exchange(key, await self._open(key), head + body)
        except TimeoutError:
            raise ShardHttpTimeout(f"no answer from {parts.netloc} within {timeout_s:.3f}s") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            raise ShardHttpError(f"{parts.netloc}: {type(exc).__name__}: {exc}"[:300]) from None

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        while idle:
            reader, writer = idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    async def _open(self, key: tuple[str, int]) -> _Conn:
        reader, writer = await asyncio.open_connection(key[0], key[1], limit=1 << 20)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return reader, writer

    async def _exchange(self, key: tuple[str, int], conn: _Conn, request: bytes) -> tuple[int, dict[str, Any]]:
        reader, writer = conn
        reuse = False
        try:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            length, chunked, reuse = None, False, True
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "transfer-encoding" and "chunked" in value:
                    chunked = True
                elif name == "connection" and value == "close":
                    reuse = False
            if chunked:
                data = await _read_chunked(reader)
            elif length is not None and 0 <= length <= MAX_BODY_BYTES:
                data = await reader.readexactly(length)
            else:
                raise ValueError("a shard answer without a usable content-length")
            out = json.loads(data) if data else {}
            if not isinstance(out, dict):
                raise ValueError("a shard answer that is not a JSON object")
            return status, out
        except BaseException:
            reuse = False
            raise
        finally:
            if reuse and len(self._idle.setdefault(key, [])) < self._max_idle:
                self._idle[key].append(conn)
            else:
                writer.close()

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return bytes(out)
        if len(out) + size > MAX_BODY_BYTES:
            raise ValueError("a shard answer over the size limit")
        out += await reader.readexactly(size)
        await reader.readexactly(2)
