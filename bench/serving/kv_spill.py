#!/usr/bin/env python3
"""The prefix cache's spill tier (engine/kv_spill.py): what a chat's next turn pays after a rest.

One engine on the bundled model. For each context length, a conversation's history is prefilled
once, then the engine rests (`release_idle_memory`, as the async loop calls it after 1 s idle),
and the next turn (the history + a few new tokens) is timed to its first token in three ways,
alternating round by round on the same engine:
  resident: spill tier off, the history kept in the resident idle budget (kv_idle_gib);
  spilled:  the default: every KV page given back at rest, the history read back from the file;
  none:     the cache emptied first (reset_prefix_cache): the whole history prefilled again.
Also the time the rest itself takes (copying the blocks to the file) and the KV memory left
resident after it. Medians over --rounds. A benchmark, not a test.

    PYTHONPATH=src .venv/bin/python bench/serving/kv_spill.py --contexts 378,1368 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from sluice.openmp_wait import sleep_when_idle

sleep_when_idle()  # as a worker runs its engine (before torch loads)

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import default_model_path, load_model
from sluice.types import GenerationRequest, SamplingParams

SENTENCE = "The lighthouse keeper climbed the steps each evening, trimmed the wick and wrote the weather down. "
FIRST = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def turn(engine: LLMEngine, rid: str, ids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    out = engine.generate([GenerationRequest(rid, ids, FIRST)])[rid]
    return time.perf_counter() - t0, out.usage.cached_tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="378,1368", help="history lengths in tokens (default: 378,1368)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    loaded = load_model(default_model_path(), progress=False)
    engine = LLMEngine(loaded, EngineConfig())
    tier = engine.kv.spill
    assert tier is not None, "the default engine has a spill tier"
    results: dict = {"bench": "kv_spill", "contexts": {}}
    for n in (int(x) for x in args.contexts.split(",")):
        ids = loaded.tokenizer.encode(SENTENCE * (n // 18 + 1))[:n]
        follow = ids + loaded.tokenizer.encode(" And then?")
        figures: dict[str, list[float]] = {"resident": [], "spilled": [], "none": [], "rest_s": []}
        cached: dict[str, int] = {}
        resident_after: list[int] = []
        for r in range(args.rounds):
            for mode in ["resident", "spilled", "none"] if r % 2 == 0 else ["none", "spilled", "resident"]:
                engine.kv.spill = tier  # a clean pool: every block given back, no cache entry left
                engine.kv.reset_prefix_cache()
                engine.release_idle_memory()
                engine.kv.spill = None if mode == "resident" else tier
                turn(engine, f"h{n}-{r}-{mode}", ids)  # the history: its blocks become cache entries
                t0 = time.perf_counter()
                engine.release_idle_memory()  # the rest between two turns
                if mode == "spilled":
                    figures["rest_s"].append(time.perf_counter() - t0)
                    resident_after.append(engine.stats().kv_resident_bytes)
                if mode == "none":
                    engine.kv.reset_prefix_cache()
                took, cached[mode] = turn(engine, f"t{n}-{r}-{mode}", follow)
                figures[mode].append(took)
        engine.kv.spill = tier
        med = {k: statistics.median(v) for k, v in figures.items()}
        results["contexts"][n] = {
            **{f"{k}_ms": 1000 * v for k, v in med.items()},
            "cached_tokens": cached,
            "kv_resident_after_rest_bytes": max(resident_after),
        }
        print(
            f"{n:5d} tokens: next turn's first token  resident {1000 * med['resident']:7.1f} ms  "
            f"spilled {1000 * med['spilled']:7.1f} ms  none {1000 * med['none']:7.1f} ms  "
            f"(cached {cached}); the rest {1000 * med['rest_s']:.1f} ms, KV resident after it "
            f"{max(resident_after) / 2**20:.1f} MiB",
            file=sys.stderr,
            flush=True,
        )
    print(json.dumps(results))


if __name__ == "__main__":
    main()
