#!/usr/bin/env python3
"""The gateway's CPU per streamed token, without a model: the real ASGI app (authentication,
admission, safety, the serving pipeline, the OpenAI renderer, SSE) on a scripted engine
(tests/fake_engine.py) that emits --tokens text events at once, read through httpx's ASGI
transport in the same process. Reported: this process's CPU time per streamed event (gateway
and client together: an upper bound for the gateway's share); `--profile` prints the top
functions by their own time. Ends with one JSON line.

    PYTHONPATH=src .venv/bin/python bench/serving/gateway_token_cost.py [--tokens 400] [--streams 5] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fake_engine import Script
from tests.fuzz_app import MODEL, scripted_app
from tests.tiny_models import write_tiny_model


async def run(tokens: int, streams: int, prof: cProfile.Profile | None) -> dict:
    tiny = write_tiny_model(Path(tempfile.mkdtemp()) / "tiny", "llama")
    app, _rt, _engine = await scripted_app(tiny, Script(texts=[f" w{i}" for i in range(tokens)]), max_model_len=4096)
    body = {
        "model": MODEL,
        "max_tokens": tokens + 8,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": "hello there"}],
    }
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:

        async def one() -> int:
            n = 0
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    n += line.startswith("data:")
            return n

        await one()  # warm-up
        c0 = time.process_time()
        if prof is not None:
            prof.enable()
        events = 0
        for _ in range(streams):
            events += await one()
        if prof is not None:
            prof.disable()
        cpu = time.process_time() - c0
    return {"events": events, "cpu_ms_per_event": 1000 * cpu / max(1, events), "profiled": prof is not None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=400, help="text events per stream (default: 400)")
    p.add_argument("--streams", type=int, default=5, help="streams, one after another (default: 5)")
    p.add_argument("--profile", action="store_true", help="cProfile the streams (inflates the CPU figure)")
    args = p.parse_args()
    prof = cProfile.Profile() if args.profile else None
    res = asyncio.run(run(args.tokens, args.streams, prof))
    print(f"{res['events']} events, {res['cpu_ms_per_event']:.3f} ms CPU per event (gateway + client)", file=sys.stderr)
    if prof is not None:
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
