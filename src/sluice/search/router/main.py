"""`sluice search serve`: the router, plus its local replicas as supervised child processes.

The HTTP socket listens first (/health answers, /ready says "starting"), the local replicas
start, the first health poll learns every shard's state, then /ready turns 200. On SIGTERM /
SIGINT: stop accepting, stop the replicas (SIGTERM, then SIGKILL after 10 s).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from pathlib import Path

from sluice.search.router.config import LOCAL, SearchConfig
from sluice.search.router.replication.hot_shard_scaler import HotShardScaler
from sluice.search.router.replication.supervisor import Supervisor
from sluice.search.router.runtime import RouterRuntime, schema_of

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


def local_index_dirs(cfg: SearchConfig, sup: Supervisor) -> dict[int, Path]:
    """Each shard's first local replica's index folder (the router reads it with local_reads)."""
    out: dict[int, Path] = {}
    for pos, shard in enumerate(cfg.shards):
        first = (
            next((r for r in sup.replicas if r.name == f"{shard.name}/{shard.replicas.index(LOCAL)}"), None)
            if LOCAL in shard.replicas
            else None
        )
        if first is not None:
            out[pos] = first.data_dir / "index"
    return out


class RouterProcess:
    """The router's lifetime in one process: its runtime, its local replicas, the loops beside
    the requests (supervision, hot shards), started with the server and stopped with it."""

    def __init__(self, cfg: SearchConfig):
        self.cfg = cfg
        self.sup = Supervisor(Path(cfg.search.data_dir), schema_of(cfg))
        urls, self.local = plan_replicas(cfg, self.sup)
        self.rt = RouterRuntime(cfg, urls, self.local, local_dirs=local_index_dirs(cfg, self.sup))
        self.tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        """Call from the thread that lives as long as the router (the replicas' PR_SET_PDEATHSIG)."""
        self.sup.start_all()
        self.tasks.append(asyncio.create_task(self._supervise()))
        self.tasks.append(asyncio.create_task(self._ready()))
        if self.cfg.search.hot_shards:
            scaler = HotShardScaler(self.rt.topo, self.sup, self.cfg.search, self.rt.extra_status)
            self.tasks.append(asyncio.create_task(scaler.run()))

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await self.rt.stop()
        self.sup.stop_all()

    async def _supervise(self) -> None:
        while True:
            for r in self.sup.check():
                shard, _ = r.name.split("/")
                self.rt.metrics.restarts.labels(shard, r.name).inc()
            self.rt.extra_status["local_pids"] = self.sup.pids()
            await asyncio.sleep(0.25)

    async def _ready(self) -> None:
        await self.rt.start()
        while self.rt.not_ready_reason() is not None:
            await self.rt.poller.next_poll()
        # what start-up built (modules, the app, the replicas' state) is never freed: out of the
        # collector's full passes, each of which walked all of it (~60 ms) under a query load
        gc.freeze()
        c = self.cfg
        n_rep = sum(len(s.replicas) for s in c.shards)
        _say(
            f"ready: {len(c.shards)} shards, {n_rep} replicas ({sum(map(sum, self.local))} local), "
            f"{c.search.sharding.value} sharding, {c.search.stats.value} statistics, auth: {self.rt.auth.mode}, "
            f"data under {c.search.data_dir}"
        )


def run_router(cfg: SearchConfig, host: str, port: int) -> int:
    import uvicorn

    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.http.search_protocol import uvicorn_http_option

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per shard request otherwise
    router = RouterProcess(cfg)
    app = create_router_app(router.rt)
    app.on_event("startup")(router.start)
    app.on_event("shutdown")(router.stop)
    _say(f"listening on http://{host}:{port} (search API at /v1/search, docs at /docs)")
    uvicorn.run(
        RouterFront(app, router.rt),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        **uvicorn_http_option(router.rt),  # POST /v1/search answered inside the protocol (search_protocol.py)
    )
    return 0
