"""A real S3-compatible server for tests: moto's server mode (from PyPI, `moto[server]`) on a free
127.0.0.1 port, started by the test and stopped by its PID."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.server_process import free_port

# moto accepts any credentials; boto3 needs some to sign with
AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
START_TIMEOUT_S = 60


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/moto-api/", timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


@contextmanager
def moto_server(log_dir: Path) -> Iterator[str]:
    """The endpoint URL of a fresh moto server, stopped (by PID) when the block ends."""
    port = free_port()
    log = open(log_dir / "moto.log", "wb")
    server = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _up(url):
            assert proc.poll() is None, f"moto_server exited ({proc.returncode}); see {log_dir / 'moto.log'}"
            assert time.monotonic() < deadline, "moto_server did not start"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
