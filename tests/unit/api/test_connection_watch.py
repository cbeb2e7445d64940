"""The connection watch on real loopback sockets: a peer that stops reading is cut once nothing
has been acknowledged for the timeout; a peer that reads slowly, or an idle one, is not."""

from __future__ import annotations

import asyncio
import socket

from sluice.api.connection_watch import ConnectionState, ConnectionWatch, _CountingTransport

TIMEOUT_S = 0.6


class _Writer(asyncio.Protocol):
    """Writes 1 KiB every 20 ms (a fast stream) while `writing`, through the counting transport."""

    def __init__(self, watch: ConnectionWatch, states: list[ConnectionState], writing: bool) -> None:
        self.watch, self.states, self.writing = watch, states, writing
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.state = ConnectionState(transport)  # type: ignore[arg-type]
        self.states.append(self.state)
        self.watch.add(self.state)
        self.out = _CountingTransport(transport, self.state)  # type: ignore[arg-type]
        if self.writing:
            asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while not self.out.is_closing():
            self.out.write(b"x" * 1024)
            await asyncio.sleep(0.02)

    def connection_lost(self, exc: Exception | None) -> None:
        self.watch.remove(self.state)
        if not self.lost.done():
            self.lost.set_result(None)


async def _serve(writing: bool, cut: list) -> tuple[asyncio.Server, list[ConnectionState], int]:
    watch = ConnectionWatch(TIMEOUT_S, on_stall=cut.append)
    states: list[ConnectionState] = []
    server = await asyncio.get_running_loop().create_server(lambda: _Writer(watch, states, writing), "127.0.0.1", 0)
    return server, states, server.sockets[0].getsockname()[1]


def _client(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    return sock


def test_a_peer_that_never_reads_is_cut_after_the_timeout():
    async def run() -> None:
        cut: list = []
        server, states, port = await _serve(True, cut)
        sock = _client(port)
        t0 = asyncio.get_running_loop().time()
        while not cut:
            assert asyncio.get_running_loop().time() - t0 < 20, "never cut"
            await asyncio.sleep(0.05)
        elapsed = asyncio.get_running_loop().time() - t0
        assert elapsed >= TIMEOUT_S and states[0].cut
        sock.close()
        server.close()

    asyncio.run(run())


def test_a_slow_reader_and_an_idle_peer_are_not_cut():
    async def run() -> None:
        cut: list = []
        server, _, port = await _serve(True, cut)
        slow = _client(port)
        idle_server, _, idle_port = await _serve(False, cut)
        idle = _client(idle_port)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = 0
        while loop.time() - t0 < 5 * TIMEOUT_S:  # reads far less than the 50 KiB/s written
            try:
                got += len(slow.recv(1024))
            except BlockingIOError:
                pass
            await asyncio.sleep(0.1)
        assert not cut and got > 0
        slow.close()
        idle.close()
        server.close()
        idle_server.close()

    asyncio.run(run())


def test_a_request_sent_before_the_header_deadline_is_served_however_busy_the_loop():
    """Between reading sockets and running due timers the loop runs callbacks; one that holds it
    past a connection's header deadline (a busy process, starved of the CPU) used to leave that
    connection's request unread when its deadline fired, so it was taken for a connection that
    never spoke and closed without an answer ("server disconnected without sending a response").
    The bytes waiting in the kernel now count: the request is read and answered. The loop is
    held on purpose, by another connection's read callback that sleeps past the deadline, so
    this holds on any machine."""
    import threading
    import time

    import uvicorn
    import uvloop

    from sluice.api.connection_watch import watched_protocol
    from sluice.api.read_guard import ReadGuard, ReadLimits

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    busy = threading.Event()
    guard = ReadGuard(ReadLimits(header_timeout_s=0.3))

    class Holding(watched_protocol(ConnectionWatch(60.0), guard)):
        def data_received(self, data: bytes) -> None:
            if data == b"HOLD":  # the loop is busy for 1 s inside its read callbacks
                busy.set()
                time.sleep(1.0)
                return
            super().data_received(data)

    server = uvicorn.Server(uvicorn.Config(app, http=Holding, log_level="warning", lifespan="off"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    loop = uvloop.new_event_loop()  # as uvicorn serves (its loop="auto")
    thread = threading.Thread(target=lambda: loop.run_until_complete(server.serve(sockets=[listener])), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        holder = socket.create_connection(listener.getsockname(), timeout=60)
        client = socket.create_connection(listener.getsockname(), timeout=60)
        while len(guard.incomplete) < 2:  # both accepted: the client's 0.3 s header deadline runs
            assert time.monotonic() < deadline, "the connections were not accepted"
            time.sleep(0.01)
        holder.sendall(b"HOLD")
        assert busy.wait(60)
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # in time: the loop just cannot read it yet
        response = b""
        while b"ok" not in response and (chunk := client.recv(4096)):
            response += chunk
        assert response.startswith(b"HTTP/1.1 200"), response
        client.close()
        holder.close()
    finally:
        server.should_exit = True
        thread.join(60)
        loop.close()
