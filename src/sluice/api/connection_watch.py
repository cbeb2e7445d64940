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
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
import time
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("sluice.server")
SCOPE_KEY = "sluice.connection"
_OUTQ = getattr(termios, "TIOCOUTQ", None)  # == SIOCOUTQ on Linux; elsewhere only our buffer counts


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
            peer[0] if peer else "?", pending, now - state.progress_at,
        )
        if self.on_stall is not None:
            self.on_stall(state)
        state.transport.abort()  # RST; uvicorn's connection_lost reports http.disconnect


def watched_protocol(watch: ConnectionWatch) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with this watch on each connection."""

    class WatchedHttpToolsProtocol(HttpToolsProtocol):
        _sluice_state: ConnectionState | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            state = ConnectionState(transport)
            self._sluice_state = state
            watch.add(state)
            super().connection_made(_CountingTransport(transport, state))  # type: ignore[arg-type]

        def connection_lost(self, exc: Exception | None) -> None:
            if self._sluice_state is not None:
                watch.remove(self._sluice_state)
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope[SCOPE_KEY] = self._sluice_state  # type: ignore[literal-required]

    return WatchedHttpToolsProtocol


def connection_of(scope: dict) -> ConnectionState | None:
    return scope.get(SCOPE_KEY)
