"""The router's CPU per POST /v1/search spent outside the search: its HTTP front alone.

The router process runs as `sluice search serve` does (uvicorn, the ASGI front, the FastAPI
app), but its search is a stub that answers a fixed 10-hit answer at once, so the router's CPU
per request (from /proc) is the way to the search and back: uvicorn, the front, the key check,
the body's decoding through the contract and the answer's writing. Two fronts side by side, in
alternating runs: `asgi` (uvicorn's own protocol and the ASGI front, router/http/front.py) and
`protocol` (the search answered inside uvicorn's protocol, router/http/search_protocol.py).
8 client threads, one keep-alive connection each.

    PYTHONPATH=src .venv/bin/python bench/search/search_front_cpu.py --requests 4000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import search_latency  # the raw client, a free port, /proc CPU (it puts the root on the path)

from bench.common import answers_200

FRONTS = ("asgi", "protocol")


def serve(front: str, port: int) -> None:
    """The router's front over a stub search (run in the child process)."""
    import uvicorn

    from sluice.search.contract import SearchRequest, SearchResponse
    from sluice.search.index.hits import Hit
    from sluice.search.router.config import parse_config
    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.http.search_protocol import uvicorn_http_option
    from sluice.search.router.runtime import RouterRuntime

    rt = RouterRuntime(parse_config('[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n'), [["http://127.0.0.1:9"]])
    text = "a stored description of a package, about as long as one in the Debian corpus " * 3
    hits = [Hit(f"doc-{i}", 10.0 - i, f'{{"title":"title {i}","body":"{text}"}}') for i in range(10)]
    answer = SearchResponse(hits, 1, 1, {}, 0.5, False)

    async def stub(req: SearchRequest) -> SearchResponse:
        return answer

    rt.search = stub  # type: ignore[method-assign, assignment]  # the search is not what is measured
    option = uvicorn_http_option(rt) if front == "protocol" else {}
    app = RouterFront(create_router_app(rt), rt)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off", **option)


def measure(front: str, requests: int, clients: int) -> dict:
    port = search_latency.free_port()
    p = subprocess.Popen([sys.executable, __file__, "--serve", front, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        if not answers_200(url + "/health"):
            raise RuntimeError(f"the {front} router did not start")
        conns = [search_latency.RawClient(url) for _ in range(clients)]
        body = {"query": "python library", "top_k": 10, "snippet_chars": 0}

        def run(c: search_latency.RawClient, n: int) -> None:
            for _ in range(n):
                assert len(c.post("/v1/search", body)["hits"]) == 10

        for c in conns:  # warm up
            run(c, 50)
        cpu0, t0 = search_latency.cpu_s(p.pid), time.perf_counter()
        threads = [threading.Thread(target=run, args=(c, requests // clients)) for c in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu1, wall = search_latency.cpu_s(p.pid), time.perf_counter() - t0
        for c in conns:
            c.close()
        n = requests // clients * clients
        return {
            "front": front,
            "cpu_us_per_request": round((cpu1 - cpu0) / n * 1e6, 1),
            "requests_per_s": round(n / wall, 1),
            "load_average": round(os.getloadavg()[0], 2),
        }
    finally:
        p.terminate()
        p.wait(30)


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="alternating runs of each front")
    args = ap.parse_args()
    for i in range(args.repeat):
        for front in FRONTS:
            print(f"run {i + 1}:", measure(front, args.requests, args.clients), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
