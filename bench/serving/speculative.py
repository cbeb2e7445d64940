"""Speculative decoding (n-gram proposals, engine/speculative.py): tokens/s per stream with and
without, side by side in one run.

Two engines on the same loaded model, one with `speculative_tokens = 0` and one with K, are
stepped in turn (one step() each, the lead swapping every step), so a burst of other work on the
shared machine lands on both alike. Each engine's time is the sum of its own steps (wall, and this
process's CPU time: with --threads 1 the latter counts the step's work, not the time other
processes held the cores). Per workload, one request alone (a person chatting), then every
workload at once (a batch of streams):

  quote    repeat a paragraph word for word
  edit     correct the typos in a paragraph, returning it whole
  code     rename a variable in a function and show the whole function
  json     return a JSON object with one field changed
  free     free text: a story, an explanation (nothing to copy)

Figures: per-stream decode tok/s = (output tokens - 1) / the engine's time from the first token
to the last; x = with / without; accepted = accepted / proposed tokens; steps = decode steps
taken. The outputs of the two engines must be equal (greedy and seeded): the run fails otherwise.

    .venv/bin/python bench/serving/speculative.py [--k 4] [--max-tokens 128] [--threads 1] [--kernels auto|torch]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from workloads import WORKLOADS

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model
from sluice.types import GenerationRequest, SamplingParams


def run_pair(engines: list[LLMEngine], reqs: list[GenerationRequest]) -> list[dict]:
    """Step both engines in turn until done; per engine: outputs and per-request timings."""
    res: list[dict[str, Any]] = []
    for e in engines:
        for r in reqs:
            e.add_request(r)
        res.append(
            {
                "wall": 0.0,
                "cpu": 0.0,
                "first": {},
                "last": {},
                "tokens": {r.request_id: [] for r in reqs},
                "steps": 0,
                "p0": e.stats().spec_proposed_tokens,
                "a0": e.stats().spec_accepted_tokens,
            }
        )
    lead = 0
    while any(e.has_unfinished() for e in engines):
        for i in (lead, 1 - lead):
            e, acc = engines[i], res[i]
            if not e.has_unfinished():
                continue
            w, c = time.perf_counter(), time.process_time()
            events = e.step()
            acc["wall"] += time.perf_counter() - w
            acc["cpu"] += time.process_time() - c
            acc["steps"] += 1
            for ev in events:
                if ev.token_ids:
                    acc["first"].setdefault(ev.request_id, (acc["wall"], acc["cpu"]))
                    acc["last"][ev.request_id] = (acc["wall"], acc["cpu"])
                    acc["tokens"][ev.request_id].extend(ev.token_ids)
        lead = 1 - lead
    for e, acc in zip(engines, res):
        st = e.stats()
        acc["proposed"], acc["accepted"] = st.spec_proposed_tokens - acc["p0"], st.spec_accepted_tokens - acc["a0"]
    return res


def rate(acc: dict, rid: str, which: int) -> float:
    n = len(acc["tokens"][rid])
    span = acc["last"][rid][which] - acc["first"][rid][which]
    return (n - 1) / span if n > 1 and span > 0 else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=4, help="speculative_tokens of the engine with speculation (default 4)")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: CPU time is the work)")
    p.add_argument("--kernels", default="auto", choices=["auto", "torch"])
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); else seeded sampling")
    p.add_argument("--batch", action="store_true", help="also every workload at once (a batch of streams)")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    loaded = load_model(progress=False, kernels=args.kernels)
    engines = [
        LLMEngine(loaded, EngineConfig(num_kv_blocks=1024, speculative_tokens=k, threads=args.threads))
        for k in (0, args.k)
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=7)

    def req(name: str, suffix: str = "") -> GenerationRequest:
        ids = loaded.tokenizer.encode_chat([{"role": "user", "content": WORKLOADS[name]}])
        return GenerationRequest(name + suffix, ids, params)

    log = sys.stderr
    results: dict = {"config": vars(args), "workloads": {}}
    print(
        f"kernels={args.kernels} uses_kernels={loaded.model.uses_kernels} threads={args.threads} k={args.k} "
        f"max_tokens={args.max_tokens} temperature={args.temperature}",
        file=log,
    )
    print(
        f"{'workload':<18}{'tokens':>7}{'off tok/s':>11}{'on tok/s':>10}{'x wall':>8}{'x CPU':>7}"
        f"{'accepted':>14}{'steps off/on':>14}",
        file=log,
    )
    mismatches = 0
    rounds = [(n, [req(n)]) for n in WORKLOADS]
    if args.batch:
        rounds.append((f"all {len(WORKLOADS)} at once", [req(n, "/batch") for n in WORKLOADS]))
    for label, reqs in rounds:
        off, on = run_pair(engines, reqs)
        for r in reqs:
            rid = r.request_id
            if off["tokens"][rid] != on["tokens"][rid]:
                mismatches += 1
        if len(reqs) == 1:
            rid = reqs[0].request_id
            w0, w1, c0, c1 = rate(off, rid, 0), rate(on, rid, 0), rate(off, rid, 1), rate(on, rid, 1)
            n = len(on["tokens"][rid])
        else:  # per-stream mean over the batch
            w0 = sum(rate(off, r.request_id, 0) for r in reqs) / len(reqs)
            w1 = sum(rate(on, r.request_id, 0) for r in reqs) / len(reqs)
            c0 = sum(rate(off, r.request_id, 1) for r in reqs) / len(reqs)
            c1 = sum(rate(on, r.request_id, 1) for r in reqs) / len(reqs)
            n = sum(len(on["tokens"][r.request_id]) for r in reqs)
        accepted = f"{on['accepted']}/{on['proposed']}"
        print(
            f"{label:<18}{n:>7}{w0:>11.1f}{w1:>10.1f}{w1 / w0:>8.2f}{c1 / c0:>7.2f}{accepted:>14}"
            f"{off['steps']:>7}/{on['steps']:<6}",
            file=log,
            flush=True,
        )
        results["workloads"][label] = {
            "tokens": n,
            "off_tok_s": w0,
            "on_tok_s": w1,
            "x_wall": w1 / w0,
            "x_cpu": c1 / c0,
            "accepted": on["accepted"],
            "proposed": on["proposed"],
            "steps_off": off["steps"],
            "steps_on": on["steps"],
        }
    print("outputs equal" if not mismatches else f"OUTPUTS DIFFER for {mismatches} requests", file=log)
    results["outputs_equal"] = not mismatches
    print(json.dumps(results))
    sys.exit(1 if mismatches else 0)


if __name__ == "__main__":
    main()
