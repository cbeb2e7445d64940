"""Run the app under uvicorn on a socket we configure, with a graceful drain on SIGTERM.

We create the listening socket ourselves (uvicorn sets neither option): TCP keep-alive and
TCP_USER_TIMEOUT make a vanished client's half-open connection fail in seconds instead of
~15 minutes of retransmits; Linux copies both options to accepted sockets.

Shutdown: the first SIGTERM/SIGINT marks the runtime as draining (new requests get 529,
/ready turns 503), uvicorn stops accepting, and open streams get `shutdown_grace_s` to finish;
past it each ends with a proper `error` event (never a silent cut).

Every connection is watched (connection_watch.py): a reader that acknowledges nothing for
`send_timeout_s` while bytes wait for it is cut, long before the buffers would fill.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Generator
from types import FrameType

import uvicorn
from starlette.types import ASGIApp

from sluice.api.connection_watch import ConnectionWatch, watched_protocol
from sluice.api.read_guard import ReadGuard, ReadLimits
from sluice.serving.runtime import ServingRuntime

log = logging.getLogger("sluice.server")


def make_socket(host: str, port: int, keepalive: bool = True, user_timeout_ms: int = 30_000) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
    # socket says it is TCP (proto 0 does not). Without it Nagle holds each response's last
    # small segment until the client's delayed ACK: +40 ms on every kept-alive request.
    # (connection_watch.py also sets it per connection.)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if keepalive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    if user_timeout_ms and hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, user_timeout_ms)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, rt: ServingRuntime):
        super().__init__(config)
        self.rt = rt

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.rt.draining:
            log.info("shutting down: draining open streams for up to %.0fs", self.rt.settings.shutdown_grace_s)
            self.rt.begin_drain(self.rt.settings.shutdown_grace_s)
        super().handle_exit(sig, frame)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # uvicorn re-raises the captured signal after its own shutdown, which would kill this
        # process before `sluice serve` stops its worker. A handled SIGTERM is a clean exit.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def build_server(app: ASGIApp, rt: ServingRuntime, access_log: bool = False) -> DrainingServer:
    s = rt.settings
    watch = ConnectionWatch(s.send_timeout_s, on_stall=lambda _state: rt.metrics.stalled_readers_cut.inc())
    guard = ReadGuard(
        ReadLimits(s.header_timeout_s, s.max_header_bytes, s.max_incomplete_requests),
        on_refuse=lambda status: rt.metrics.read_refused.labels(str(status)).inc(),
    )
    config = uvicorn.Config(
        app,
        http=watched_protocol(watch, guard) or "auto",  # "auto": uvicorn's own (common/uvicorn_protocol.py)
        log_level=s.log_level,
        log_config=None,  # logging is ours (observability/logs.py): uvicorn must not replace the handlers
        access_log=access_log,
        timeout_graceful_shutdown=int(s.shutdown_grace_s + 5),
        timeout_keep_alive=30,
        server_header=False,
        lifespan="off",
    )
    return DrainingServer(config, rt)
