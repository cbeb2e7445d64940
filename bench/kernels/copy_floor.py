#!/usr/bin/env python3
"""The physical floor of a decode step: the weights' bytes it reads ÷ the measured copy bandwidth.

A decode step reads every weight once whatever the batch (the q/k/v, o, gate/up and down
matrices of every layer, the norms, and the LM head: the whole vocabulary projection), so at small
batches its time cannot fall below bytes ÷ bandwidth. The bandwidth is measured, not taken from a
datasheet: a large device-to-device copy (bytes read + bytes written per copy), timed with CUDA
events, median of --reps. The KV cache's reads are left out (they grow with context and batch;
at ~100-200 tokens of context they are under 1 % of the 135M model's weights per stream).

    PYTHONPATH=src python3 bench/kernels/copy_floor.py --device cuda --json-out floor.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from sluice.models.random_init import SHAPES, hf_config

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def decode_weight_bytes(shape: str, dtype: str) -> int:
    """Bytes of weights one decode step reads (the embedding lookup's few rows left out)."""
    c = hf_config(shape)
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    head_dim = c.get("head_dim") or hidden // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter + 2 * hidden
    return BYTES[dtype] * (c["num_hidden_layers"] * per_layer + hidden + vocab * hidden)


def copy_bandwidth(device: torch.device, mib: int, reps: int) -> dict:
    """Device-to-device copy: (read + write) bytes per second, median over `reps` copies."""
    n = mib * 2**20 // 4
    src = torch.randn(n, device=device)  # random, never zeros (METHOD: zeros can run faster)
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 3):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            dt = start.elapsed_time(end) / 1000
        else:
            t = time.perf_counter()
            dst.copy_(src)
            dt = time.perf_counter() - t
        if i >= 3:  # warm-up copies left out
            times.append(dt)
    assert torch.equal(dst[:1024], src[:1024]) and torch.equal(dst[-1024:], src[-1024:])
    med = statistics.median(times)
    return {
        "buffer_mib": mib,
        "reps": reps,
        "median_s": med,
        "min_s": min(times),
        "gb_s": 2 * n * 4 / med / 1e9,
        "gb_s_best": 2 * n * 4 / min(times) / 1e9,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--mib", type=int, default=2048, help="copy buffer size in MiB (default: 2048, many times L2)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--shapes", default="small,1b", help=f"random-init shapes to size ({', '.join(SHAPES)})")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    bw = copy_bandwidth(device, args.mib, args.reps)
    floors = {}
    for shape in args.shapes.split(","):
        for dtype in args.dtypes.split(","):
            b = decode_weight_bytes(shape, dtype)
            floors[f"{shape}/{dtype}"] = {
                "weight_bytes": b,
                "floor_ms_per_step": 1000 * b / (bw["gb_s"] * 1e9),
                "floor_tok_s_per_stream": bw["gb_s"] * 1e9 / b,
            }
    record = {
        "bench": "copy_floor",
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "copy": bw,
        "floors": floors,
    }
    for k, f in floors.items():
        print(
            f"{k:<18} {f['weight_bytes'] / 1e6:9.1f} MB/step  floor {f['floor_ms_per_step']:.4f} ms/step "
            f"({f['floor_tok_s_per_stream']:.0f} tok/s per stream at batch 1)",
            file=sys.stderr,
        )
    print(f"copy bandwidth {bw['gb_s']:.0f} GB/s (best {bw['gb_s_best']:.0f})", file=sys.stderr)
    print(json.dumps(record), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump(record, out)


if __name__ == "__main__":
    main()
