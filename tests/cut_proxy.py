"""A TCP proxy in front of a real server that can cut its traffic at a known request: the object
store going away in the middle of a checkpoint, at the same point on every machine's speed.

Connections are piped both ways until a client sends a request line that contains `cut_at`
(e.g. `.distcp`, the first data object of a checkpoint): that connection is closed before
anything of the request reaches the server, and so is every connection after it, each as soon as
it is accepted, until `restore()` (the store is back). Stopped with `close()`."""

from __future__ import annotations

import socket
import threading

from tests.server_process import free_port


class CutProxy:
    def __init__(self, target_port: int, cut_at: bytes):
        self.target_port = target_port
        self.cut_at = cut_at
        self.cut = threading.Event()
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restore(self) -> None:
        self.cut.clear()
        self.cut_at = b"\0never\0"

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.cut.is_set():
                client.close()
                continue
            server = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, watch: bool) -> None:
        try:
            while data := src.recv(65536):
                # a request line is "PUT /bucket/key HTTP/1.1": look where one may start
                if watch and any(self.cut_at in line for line in data.split(b"\r\n") if line.startswith(b"PUT /")):
                    self.cut.set()
                if self.cut.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
