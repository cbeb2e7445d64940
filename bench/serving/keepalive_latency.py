#!/usr/bin/env python3
"""Kept-alive vs fresh connections: the median latency of `GET /health` on running servers.

Issue: accepted sockets without TCP_NODELAY made every request after the first on a kept-alive
connection wait ~40 ms (Nagle meets delayed ACK). Point it at one or more running servers (for
example the two that `bench/serving/compare_serving.py` starts, before and after a change):

    .venv/bin/python bench/serving/keepalive_latency.py PORT [PORT ...] [--n 60]
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import time


def median_ms(port: int, keep_alive: bool, n: int) -> float:
    times = []
    kept = http.client.HTTPConnection("127.0.0.1", port) if keep_alive else None
    for _ in range(n + 1):
        conn = kept or http.client.HTTPConnection("127.0.0.1", port)
        t0 = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        times.append(time.perf_counter() - t0)
        if kept is None:
            conn.close()
    if kept is not None:
        kept.close()
    return 1000 * statistics.median(times[1:])  # the first request pays the connect either way


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ports", type=int, nargs="+")
    ap.add_argument("--n", type=int, default=60, help="requests per variant (default 60)")
    args = ap.parse_args()
    for port in args.ports:
        fresh, kept = median_ms(port, False, args.n), median_ms(port, True, args.n)
        print(
            f"127.0.0.1:{port}  fresh connection {fresh:.2f} ms   kept-alive {kept:.2f} ms   ratio {kept / fresh:.2f}"
        )


if __name__ == "__main__":
    main()
