"""What an acknowledged write tells the router at once, before any health poll: a real shard
replica, the router's runtime in this process with its poller never started (the poll that
used to be the only source of a replica's index age, in the status and on /metrics, runs
every 0.5 s, and on a busy machine a status read right after a write came before it)."""

from __future__ import annotations

import asyncio
import json
import re

from prometheus_client import generate_latest

from sluice.search.router.config import parse_config
from sluice.search.router.runtime import RouterRuntime
from tests.system.search.cluster import start_shard


def test_an_acknowledged_write_dates_the_index_without_a_poll(tmp_path):
    shard = start_shard(tmp_path / "r0")
    try:
        addr = shard.url.removeprefix("http://")
        rt = RouterRuntime(parse_config(f'[[shards]]\nname = "a"\nreplicas = ["{addr}"]\n'), [[shard.url]])

        async def write_then_status():
            try:
                answer = await rt.write(json.dumps({"id": "x", "body": "hello"}).encode())
                return answer, rt.status(), generate_latest(rt.metrics.registry).decode()
            finally:
                await rt.stop()

        answer, st, metrics = asyncio.run(write_then_status())
        assert not answer.outcome.failed and rt.poller.polls == 0
        (s,) = st["shards"]
        assert s["head_seq"] == 1 and s["replicas"][0]["applied_seq"] == 1
        assert s["index_age_s"] is not None and s["replicas"][0]["index_age_s"] is not None, s
        # and on /metrics, computed when scraped (it was set at each poll, so absent until one)
        assert re.search(r'sluice_search_index_age_seconds\{replica="a/0",shard="a"\} [0-9.e-]+\n', metrics), metrics
    finally:
        shard.stop()
