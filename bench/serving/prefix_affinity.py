#!/usr/bin/env python3
"""Prefix affinity vs round robin: 8 tenants, each with its own ~300-token system prompt, over
two workers whose KV pools hold only about five such prompts each.

Two gateways, each with its own two local replicas of the bundled model and the same fleet file
except `[routing] worker_choice`: "affinity" (the default: a prefix keeps its worker while that
worker's load is within the bound) and "round_robin" (every request to the next worker, blind to
prefixes). The same request sequence goes to both, request by request in alternating order:
rounds of the 8 tenants in a seeded random order, each request the tenant's system prompt plus
a short question, streamed, max_tokens 4. Reported per variant: the cached fraction of prompt
tokens (Σ usage.cache_read_input_tokens / Σ prompt tokens: the engine's prefix-cache hits) and
TTFT p50, and their ratios; also how the affinity router split the tenants' prefixes over the
workers (fleet status `prefix_groups`: new prefixes go to the worker holding the fewest).

    .venv/bin/python bench/serving/prefix_affinity.py [--rounds 10] [--kv-blocks 224]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import pct
from bench.serving.fleet_common import ADMIN, MODEL, cpu_seconds, fleet_status, load_average, stream, wait_warm
from tests.server_process import start_server

TENANTS = [f"tenant-{c}" for c in "abcdefgh"]
COMPANIES = [
    "Aldermoor Freight",
    "Brightwater Bakery",
    "Copperline Rail",
    "Driftwood Books",
    "Emberfield Farms",
    "Foxglove Clinic",
    "Granite Peak Gear",
    "Harbourlight Insurance",
]
RULES = [
    "Always greet the customer by name when it is known.",
    "Never promise a delivery date you cannot check.",
    "Refunds above fifty euros need a supervisor's approval.",
    "Keep every answer under five sentences.",
    "Offer the help centre link when a question is about accounts.",
    "Apologise once, not repeatedly.",
    "Escalate any safety concern to a human at once.",
    "Do not discuss competitors or their prices.",
    "Summarise the customer's problem before answering it.",
    "Use plain words; avoid internal jargon.",
    "Confirm order numbers digit by digit.",
    "End with a question that checks the problem is solved.",
]


def system_prompt(i: int, tokenizer, target: int = 300) -> str:
    """The tenant's system prompt: its company and the rules in a tenant-specific order, cut at
    about `target` tokens."""
    rng = random.Random(i)
    text = f"You are the customer support assistant of {COMPANIES[i]}. Follow these rules:"
    while len(tokenizer.encode(text)) < target:
        text += " " + rng.choice(RULES)
    return text


def fleet_file(choice: str, kv_blocks: int) -> Path:
    path = Path(tempfile.mkdtemp(prefix="sluice-bench-")) / "fleet.toml"
    path.write_text(
        f'[routing]\nworker_choice = "{choice}"\n[models."{MODEL}".versions.v1]\nweights = "bundled"\n'
        f'traffic = 100\nreplicas = 2\n[models."{MODEL}".versions.v1.engine]\nnum_kv_blocks = {kv_blocks}\n'
        "max_num_seqs = 4\n"
    )
    return path


def affinity_split(url: str) -> list[int]:
    """Prefix groups per worker as the affinity gateway's router placed them (its fleet status)."""
    return sorted((w.get("prefix_groups", 0) for w in fleet_status(url)["workers"]), reverse=True)


async def run(urls: dict[str, str], keys: list[str], prompts: list[str], rounds: int, pids: dict[str, int]) -> dict:
    order_rng = random.Random(7)
    sequence = []
    for r in range(rounds):
        tenants = list(range(len(TENANTS)))
        order_rng.shuffle(tenants)
        sequence += [(r, t) for t in tenants]
    stats: dict[str, dict[str, Any]] = {v: {"read": 0, "prompt": 0, "ttft": []} for v in urls}
    cpu0 = {v: cpu_seconds(p) for v, p in pids.items()}
    async with httpx.AsyncClient(timeout=300) as client:
        for step, (r, t) in enumerate(sequence):
            body = {
                "model": MODEL,
                "max_tokens": 4,
                "temperature": 0,
                "system": prompts[t],
                "messages": [{"role": "user", "content": f"Question {r}: when are you open on Sundays?"}],
            }
            variants = list(urls) if step % 2 == 0 else list(urls)[::-1]
            for v in variants:
                reply = await stream(client, urls[v], body, {"x-api-key": keys[t]})
                assert reply.ok, reply.events
                u = reply.usage
                stats[v]["read"] += u["cache_read_input_tokens"]
                stats[v]["prompt"] += (
                    u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
                )
                stats[v]["ttft"].append(reply.ttft)
    out: dict[str, Any] = {}
    for v, s in stats.items():
        out[v] = {
            "cached_fraction": s["read"] / s["prompt"],
            "ttft_p50_ms": 1000 * pct(s["ttft"], 0.5),
            "ttft_p90_ms": 1000 * pct(s["ttft"], 0.9),
            "requests": len(s["ttft"]),
            "gateway_cpu_ms_per_request": 1000 * (cpu_seconds(pids[v]) - cpu0[v]) / len(s["ttft"]),
        }
    a, rr = out["affinity"], out["round_robin"]
    out["cached_fraction_ratio"] = (
        a["cached_fraction"] / rr["cached_fraction"] if rr["cached_fraction"] else float("inf")
    )
    out["ttft_p50_ratio_rr_over_affinity"] = rr["ttft_p50_ms"] / a["ttft_p50_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="rounds of the 8 tenants (default 10)")
    ap.add_argument("--kv-blocks", type=int, default=224, help="KV blocks per worker (8 tokens each; default 224)")
    args = ap.parse_args()
    from sluice.gateway.key_store import SQLiteKeyStore
    from sluice.models.tokenizer_loader import load_tokenizer

    tokenizer = load_tokenizer(None)[0]
    prompts = [system_prompt(i, tokenizer) for i in range(len(TENANTS))]
    data = Path(tempfile.mkdtemp(prefix="sluice-bench-keys-"))
    store = SQLiteKeyStore(data / "keys.db")
    keys = [store.create(t, "priority")[0] for t in TENANTS]
    env = {"SLUICE_ADMIN_KEY": ADMIN, "SLUICE_DATA_DIR": str(data)}
    procs = {}
    try:
        for choice in ("affinity", "round_robin"):
            procs[choice] = start_server(["--fleet", str(fleet_file(choice, args.kv_blocks))], env=env, timeout=600)
            wait_warm(procs[choice].base_url, 2)
        urls = {v: p.base_url for v, p in procs.items()}
        load0 = load_average()
        result = asyncio.run(run(urls, keys, prompts, args.rounds, {v: p.process.pid for v, p in procs.items()}))
        result["affinity_tenants_per_worker"] = affinity_split(urls["affinity"])
        result["system_prompt_tokens"] = [len(tokenizer.encode(p)) for p in prompts]
        result["load_average"] = [round(load0, 1), round(load_average(), 1)]
        print(json.dumps(result))
    finally:
        for p in procs.values():
            p.stop()


if __name__ == "__main__":
    main()
