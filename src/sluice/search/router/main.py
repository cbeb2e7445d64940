"""`sluice search serve`: the router, plus its local replicas as supervised child processes.

The HTTP socket listens first (/health answers, /ready says "starting"), the local replicas
start, the first health poll learns every shard's state, then /ready turns 200. On SIGTERM /
SIGINT: stop accepting, stop the replicas (SIGTERM, then SIGKILL after 10 s).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path

from sluice.search.router.config import LOCAL, SearchConfig
from sluice.search.router.hot_shards import Change, HotShardTracker, utilization
from sluice.search.router.replica_state import ReplicaState
from sluice.search.router.runtime import RouterRuntime, schema_of
from sluice.search.router.supervisor import Supervisor

log = logging.getLogger("sluice.search.router")


def _say(msg: str) -> None:
    print(f"sluice search: {msg}", file=sys.stderr, flush=True)


def plan_replicas(cfg: SearchConfig, sup: Supervisor) -> tuple[list[list[str]], list[list[bool]]]:
    urls, local = [], []
    for shard in cfg.shards:
        u, l_ = [], []
        for i, rep in enumerate(shard.replicas):
            if rep == LOCAL:
                u.append(sup.add(shard.name, i).url)
                l_.append(True)
            else:
                u.append(rep if rep.startswith("http") else f"http://{rep}")
                l_.append(False)
        urls.append(u)
        local.append(l_)
    return urls, local


def run_router(cfg: SearchConfig, host: str, port: int) -> int:
    import uvicorn

    from sluice.search.router.app import create_router_app
    from sluice.search.router.fast_http.search_path import SearchFastPath

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per shard request otherwise
    sup = Supervisor(Path(cfg.search.data_dir), schema_of(cfg))
    urls, local = plan_replicas(cfg, sup)
    rt = RouterRuntime(cfg, urls, local)
    app = create_router_app(rt)

    async def supervise() -> None:
        while True:
            for r in sup.check():
                shard, idx = r.name.split("/")
                rt.metrics.restarts.labels(shard, r.name).inc()
            rt.extra_status["local_pids"] = sup.pids()
            await asyncio.sleep(0.25)

    tasks: list[asyncio.Task] = []
    c = cfg.search
    tracker = HotShardTracker(c)  # the thresholds are the settings' (hot_at, cool_at, hot_for, …)

    async def hot_shards() -> None:
        last = {s.name: s.index_busy_s for s in rt.topo.shards}
        then = time.monotonic()
        while True:
            await asyncio.sleep(cfg.search.hot_interval_s)
            now = time.monotonic()
            interval, then = now - then, now  # the measured one: a busy loop may wake late
            loads = {}
            for s in rt.topo.shards:
                if s.cold_url is None:
                    serving = sum(1 for r in s.replicas if r.serving)
                    loads[s.name] = utilization(s.index_busy_s - last[s.name], interval, serving)
                    last[s.name] = s.index_busy_s
            rt.extra_status["hot_shards"] = {n: {"utilization": round(u, 4), "added": tracker.added(n)}
                                             for n, u in loads.items()}
            for name, change in tracker.evaluate(loads):
                shard = next(s for s in rt.topo.shards if s.name == name)
                if change is Change.ADD:
                    r = sup.start_added(name)
                    shard.replicas.append(ReplicaState(r.url, r.name, local=True, serving=False, added=True))
                    log.info("shard %s is hot (%.0f %% busy per replica): added replica %s", name, loads[name] * 100, r.name)
                else:
                    victim = next((r for r in reversed(shard.replicas) if r.added), None)
                    if victim is not None:
                        shard.replicas.remove(victim)  # no new queries; in-flight ones finish or fail over
                        await asyncio.sleep(cfg.search.shard_deadline_ms / 1000)
                        sup.remove(victim.url)
                        log.info("shard %s cooled: removed replica %s", name, victim.name)

    @app.on_event("startup")
    async def _start() -> None:
        sup.start_all()
        tasks.append(asyncio.create_task(supervise()))
        tasks.append(asyncio.create_task(_ready()))
        if cfg.search.hot_shards:
            tasks.append(asyncio.create_task(hot_shards()))

    async def _ready() -> None:
        await rt.start()
        while rt.not_ready_reason() is not None:
            await asyncio.sleep(0.1)
        n_rep = sum(len(s.replicas) for s in cfg.shards)
        _say(f"ready: {len(cfg.shards)} shards, {n_rep} replicas ({sum(map(sum, local))} local), "
             f"{cfg.search.sharding.value} sharding, {cfg.search.stats.value} statistics, auth: {rt.auth.mode}, "
             f"data under {cfg.search.data_dir}")

    @app.on_event("shutdown")
    async def _stop() -> None:
        for t in tasks:
            t.cancel()
        await rt.stop()
        sup.stop_all()

    _say(f"listening on http://{host}:{port} (search API at /v1/search, docs at /docs)")
    uvicorn.run(SearchFastPath(app, rt), host=host, port=port, log_level="warning", access_log=False)
    return 0
