"""A watch over every HTTP connection: stalled readers are cut, disconnects are timed.

Why: a reader that stops reading (a hung client, a dead network path that still ACKs zero-window
probes) is invisible to the app until every buffer between us and it is full — uvicorn's write
buffer (64 KiB high-water mark), the kernel's socket send buffer (autotuned up to MiBs) and the
peer's receive window. At token rates an SSE stream writes ~2 KB/s, so the per-send timeout alone
would notice after minutes, and the request would hold its KV blocks all that time.

How: each connection's transport is wrapped to count the bytes handed to it; the kernel says how
many of those the peer has not acknowledged yet (SIOCOUTQ). Bytes pending with none acknowledged
for `stall_timeout_s` → the connection is aborted (RST). uvicorn then reports `http.disconnect`,
the stream is cancelled and its engine request aborted (a background stream keeps generating for
resume). No error event can be written to such a reader: its buffers are full — it is dropped.

The watch also stamps when each connection closed, so the app can measure how long a disconnect
takes to become an engine abort (`sluice_disconnect_abort_seconds`).

Both the watch and the read guard live in a subclass of uvicorn's private httptools protocol,
found through common/uvicorn_protocol.py; where the installed uvicorn's differs, `watched_protocol`
returns None and the server runs on uvicorn's own protocol, without them (with a warning).
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import socket
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

from starlette.types import Scope

from sluice.api.read_guard import ReadGuard, raw_error_response
from sluice.common.uvicorn_protocol import fallback_warning, httptools_protocol

log = logging.getLogger("sluice.server")
SCOPE_KEY = "sluice.connection"
LINGER_S = 2.0  # after refusing a request: how long its remaining bytes are read and dropped
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # == SIOCOUTQ on Linux; elsewhere only our buffer counts
# At the header deadline, bytes the kernel holds unread mean the peer spoke in time and the loop
# has not read them yet: busy, it runs due timers before reading sockets (uvloop's order). The
# verdict waits this long, once, so the next poll reads them first.
READ_GRACE_S = 0.05
# the class the watched protocol extends; `object` where uvicorn's differs (then never served)
_HTTPTOOLS: type = httptools_protocol() or object


class ConnectionState:
    """What the watch knows about one connection; the app finds it in `scope[SCOPE_KEY]`."""

    __slots__ = ("transport", "bytes_sent", "acked", "progress_at", "lost_at", "cut")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.bytes_sent = 0
        self.acked = 0
        self.progress_at = time.monotonic()
        self.lost_at: float | None = None  # time.monotonic() when the connection closed
        self.cut = False  # closed by the watch as a stalled reader

    def unacknowledged(self) -> int:
        """Bytes written that the peer has not acknowledged: our buffer plus the kernel's queue."""
        pending = self.transport.get_write_buffer_size()
        sock = self.transport.get_extra_info("socket")
        if sock is not None and _OUTQ is not None:
            try:  # SIOCOUTQ (== TIOCOUTQ on Linux): unsent + sent-but-unacknowledged bytes
                pending += struct.unpack("i", fcntl.ioctl(sock.fileno(), _OUTQ, b"\0\0\0\0"))[0]
            except (OSError, ValueError):  # closed meanwhile (fd -1)
                pass
        return pending


class _CountingTransport:
    """The transport uvicorn writes to, counting bytes; everything else is passed through."""

    def __init__(self, transport: asyncio.Transport, state: ConnectionState) -> None:
        self._transport = transport
        self._state = state

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._state.bytes_sent += len(data)
        self._transport.write(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ConnectionWatch:
    def __init__(self, stall_timeout_s: float, on_stall: Callable[[ConnectionState], None] | None = None):
        self.stall_timeout_s = stall_timeout_s
        self.interval_s = min(1.0, stall_timeout_s / 4)
        self.on_stall = on_stall
        self.connections: set[ConnectionState] = set()
        self._task: asyncio.Task | None = None

    def add(self, state: ConnectionState) -> None:
        self.connections.add(state)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sluice-connection-watch")

    def remove(self, state: ConnectionState) -> None:
        state.lost_at = time.monotonic()
        self.connections.discard(state)

    async def _run(self) -> None:
        while self.connections:  # ends with the last connection; the next one restarts it
            await asyncio.sleep(self.interval_s)
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        for state in list(self.connections):
            if state.transport.is_closing():
                continue
            if state.bytes_sent == state.acked:  # all acknowledged at the last look, nothing since
                state.progress_at = now
                continue
            pending = state.unacknowledged()
            acked = state.bytes_sent - pending
            if pending == 0 or acked > state.acked:
                state.acked = acked
                state.progress_at = now
            elif now - state.progress_at >= self.stall_timeout_s:
                self._cut(state, pending, now)

    def _cut(self, state: ConnectionState, pending: int, now: float) -> None:
        state.cut = True
        peer = state.transport.get_extra_info("peername")
        log.warning(
            "cut a stalled reader %s: %d bytes unacknowledged, none acknowledged for %.1fs",
            peer[0] if peer else "?",
            pending,
            now - state.progress_at,
        )
        if self.on_stall is not None:
            self.on_stall(state)
        state.transport.abort()  # RST; uvicorn's connection_lost reports http.disconnect


def _unread(transport: asyncio.BaseTransport) -> int:
    """Bytes received on the connection that nothing has read yet (FIONREAD; 0 where unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):  # closed meanwhile (fd -1)
        return 0


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Disable Nagle on the connection: responses are written whole, so waiting to coalesce
    small segments only adds the peer's delayed-ACK time (~40 ms) to every kept-alive request."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # closed meanwhile
            pass


class WatchedHttpToolsProtocol(_HTTPTOOLS):
    """uvicorn's httptools protocol with a ConnectionWatch on each connection and a ReadGuard's
    limits on each request; `watched_protocol` makes the subclass that names the two."""

    _watch: ConnectionWatch
    _guard: ReadGuard
    _sluice_state: ConnectionState | None = None
    _header_phase = True  # reading a request line + headers (or waiting for its first byte)
    _header_bytes = 0
    _tail = b""  # the last bytes seen, to find a header terminator split across reads
    _header_timer: asyncio.TimerHandle | None = None
    _header_grace = False  # the header deadline already waited for unread bytes once
    _rejected = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        set_nodelay(transport)
        state = ConnectionState(transport)
        self._sluice_state = state
        self._watch.add(state)
        super().connection_made(_CountingTransport(transport, state))
        if self._guard.full():  # too many connections are mid-request: refuse this one outright
            self._reject(503, "too many connections with incomplete requests; retry shortly")
            return
        self._begin_request()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._sluice_state is not None:
            self._watch.remove(self._sluice_state)
        self._end_request()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._header_phase:
            if self._header_timer is None:  # the first byte of the next kept-alive request
                self._begin_request()
            end = (self._tail + data).find(b"\r\n\r\n")
            self._header_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
            self._tail = data[-3:]
            limit = self._guard.limits.max_header_bytes
            if self._header_bytes > limit:
                self._reject(431, f"request headers are larger than the {limit}-byte limit")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[SCOPE_KEY] = self._sluice_state

    def on_headers_complete(self) -> None:
        self._header_phase = False
        self._cancel_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._end_request()  # fully read; the next request's timer starts with its first byte
        self._header_phase, self._header_bytes, self._tail = True, 0, b""

    # -- the read guard ----------------------------------------------------------------------
    def _begin_request(self) -> None:
        self._guard.incomplete.add(self)
        self._header_timer = self.loop.call_later(self._guard.limits.header_timeout_s, self._header_timeout)

    def _end_request(self) -> None:
        self._cancel_timer()
        self._guard.incomplete.discard(self)

    def _cancel_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._header_phase and not self.transport.is_closing():
            if self._header_bytes == 0 and not self._header_grace and _unread(self.transport) > 0:
                self._header_grace = True
                self._header_timer = self.loop.call_later(READ_GRACE_S, self._header_timeout)
            elif self._header_bytes == 0:  # connected and never said anything: nobody to answer
                self._guard.count(408)
                self._rejected = True
                self._end_request()
                self.transport.close()
            else:
                timeout_s = self._guard.limits.header_timeout_s
                self._reject(408, f"the request headers did not arrive within {timeout_s:g}s")

    def _reject(self, status: int, message: str) -> None:
        self._guard.count(status)
        log.info("refused a request with %d: %s", status, message)
        self._rejected = True
        self._end_request()
        self.transport.write(raw_error_response(status, message, getattr(self, "url", None) or b""))
        # Lingering close: send FIN after the response but keep reading (and dropping) for a
        # moment. Closing with the peer's bytes still unread makes the kernel send RST, and an
        # RST can destroy the response before the client has read it.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_S, self.transport.close)


def watched_protocol(watch: ConnectionWatch, guard: ReadGuard | None = None) -> type | None:
    """uvicorn's httptools protocol with this watch on each connection, and the read limits of
    `guard` (read_guard.py) on each request: a subclass per server, as uvicorn takes a class.
    None (said in a warning) when the installed uvicorn's protocol is not the one this extends:
    the server then runs on uvicorn's default protocol."""
    if _HTTPTOOLS is object or httptools_protocol() is None:
        fallback_warning("sluice serve", "the stalled-reader watch and the read guard's header limits")
        return None
    read_guard = guard or ReadGuard()

    class ServerProtocol(WatchedHttpToolsProtocol):
        _watch = watch
        _guard = read_guard

    return ServerProtocol


def connection_of(scope: Scope) -> ConnectionState | None:
    return scope.get(SCOPE_KEY)
