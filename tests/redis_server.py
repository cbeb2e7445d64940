"""A real `redis-server` on a free 127.0.0.1 port, started and stopped (by PID) by the tests."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time

import redis

from tests.server_process import free_port


class RedisServer:
    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: `make install` installs Debian's redis-server")
        self.binary = binary
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="sluice-redis-")
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._start()

    def restart_empty(self) -> None:
        """Stop the server and start a new one on the same port with no data (no persistence:
        what a Redis without RDB/AOF looks like after a restart)."""
        self._terminate()
        self._start()

    def _start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError as e:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from e
                time.sleep(0.05)

    def _terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def stop(self) -> None:
        self._terminate()
        shutil.rmtree(self.dir, ignore_errors=True)
