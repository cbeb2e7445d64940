#!/usr/bin/env python3
"""Micro-benchmarks of the CPU kernels against the torch path's building blocks.

All on the bundled GGUF's real weights, --threads (default 1) torch threads, each figure the
best of several repetitions of this process's CPU time (robust to other processes holding the
cores; caches are hot, so the M = 1 figures understate the kernels' memory advantage):

  linears    the exact kernel (and the int8 fast one) vs oneDNN-prepacked fp32 on the
             dequantized weights, gate_up (3072 x 576 Q4_1) and the LM head (49152 x 576 Q8_0)
  attention  KernelPagedAttention vs TorchPagedAttention for one layer's decodes
  prefill    one whole-prompt forward through LlamaModel on each path (exact, fast, torch)

    .venv/bin/python bench/kernels/kernel_micro.py
    .venv/bin/python bench/kernels/kernel_micro.py --ms 1,8,32 --skip-prefill
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from typing import Any

import numpy as np
import torch


def best_cpu(fn, reps: int, inner: int = 1) -> float:
    best = float("inf")
    for _ in range(reps):
        c = time.process_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.process_time() - c) / inner)
    return best


def linears(ops, ms: list[int]) -> list[dict]:
    from gguf import GGUFReader

    from sluice.models.kernels.packed_linear import PackedLinear
    from sluice.models.linear import Linear
    from sluice.models.loader import default_model_path
    from sluice.models.quantized import QuantizedWeight, QuantType

    tensors = {t.name: t for t in GGUFReader(str(default_model_path())).tensors}

    def weight(names: list[str]) -> QuantizedWeight:
        parts = []
        for n in names:
            t = tensors[n]
            parts.append(
                QuantizedWeight.from_blocks(QuantType(t.tensor_type.name), int(t.shape[1]), int(t.shape[0]), t.data)
            )
        return QuantizedWeight.concat(parts)

    out = []
    for label, names in (
        ("gate_up", ["blk.0.ffn_gate.weight", "blk.0.ffn_up.weight"]),
        ("head", ["token_embd.weight"]),
    ):
        w = weight(names)
        kernel, dense = PackedLinear(ops, w), Linear(w.dequantize())
        for m in ms:
            x = torch.randn(m, w.cols)
            reps, inner = (40, max(1, 64 // m)) if label == "gate_up" else (5, 1)
            row: dict[str, Any] = {
                "weight": label,
                "M": m,
                "onednn_us": 1e6 * best_cpu(partial(dense, x), reps, inner),
                "exact_us": 1e6 * best_cpu(partial(kernel, x), reps, inner),
            }
            if w.qtype is QuantType.Q4_1:
                row["fast_us"] = 1e6 * best_cpu(partial(kernel, x, fast=True), reps, inner)
            row["exact_gvfma_s"] = m * w.rows * w.cols / 16 / row["exact_us"] / 1e3
            out.append(row)
            print(
                f"{label:8s} M={m:4d} oneDNN {row['onednn_us']:9.0f} us  exact {row['exact_us']:9.0f} us "
                f"({row['exact_gvfma_s']:.1f} Gvfma/s)  fast {row.get('fast_us', float('nan')):8.0f} us",
                file=sys.stderr,
            )
    return out


def attention(ops) -> list[dict]:
    from sluice.models.attention import AttentionMetadata, TorchPagedAttention
    from sluice.models.kernels.paged_attention import KernelPagedAttention

    heads, kvh, d, bs = 9, 3, 64, 8
    out = []
    for b, ctx in ((1, 100), (1, 1711), (32, 130)):
        nb = -(-ctx // bs)
        blocks = b * nb + 1
        k_cache, v_cache = torch.randn(kvh, blocks * bs, d), torch.randn(kvh, blocks * bs, d)
        table = (torch.randperm(blocks - 1) + 1)[: b * nb].view(b, nb).int().contiguous()
        # one metadata per backend: prepare() keeps each backend's own per-step layout in it
        metas = [
            AttentionMetadata(
                slot_mapping=torch.empty(0, dtype=torch.long),
                num_decodes=b,
                block_size=bs,
                block_tables=table,
                context_lens=torch.full((b,), ctx, dtype=torch.int32),
            )
            for _ in range(2)
        ]
        q = torch.randn(b, (heads + 2 * kvh) * d)
        ref, kern = TorchPagedAttention(heads, kvh, d), KernelPagedAttention(ops, heads, kvh, d)
        ref.prepare(metas[0])
        kern.prepare(metas[1])
        t = best_cpu(partial(ref.attend, q, k_cache, v_cache, metas[0]), 20)
        k = best_cpu(partial(kern.attend, q, k_cache, v_cache, metas[1]), 20)
        out.append({"batch": b, "context": ctx, "torch_ms": 1e3 * t, "kernel_ms": 1e3 * k, "ratio": t / k})
        print(
            f"attention batch {b} x {ctx}: torch {1e3 * t:.3f} ms, kernel {1e3 * k:.3f} ms ({t / k:.1f}x)",
            file=sys.stderr,
        )
    return out


def prefill(lengths: list[int]) -> list[dict]:
    from sluice.models.attention import AttentionMetadata, PrefillSpan
    from sluice.models.kernels import Numerics
    from sluice.models.loader import load_model

    on_torch, on_kernels = load_model(progress=False, kernels="torch"), load_model(progress=False)

    def forward(loaded, ids: list[int], numerics: Numerics) -> None:
        m, n = loaded.model, len(ids)
        cfg = m.config
        caches = [
            (torch.zeros(cfg.num_kv_heads, n, cfg.head_dim), torch.zeros(cfg.num_kv_heads, n, cfg.head_dim))
            for _ in range(cfg.num_layers)
        ]
        slots = torch.arange(n)
        meta = AttentionMetadata(slot_mapping=slots, prefills=[PrefillSpan(0, n, slots, None)], block_size=1)
        m.forward(torch.tensor(ids), torch.arange(n), meta, caches, torch.tensor([n - 1]), numerics=numerics)

    out = []
    for n in lengths:
        ids = [(7 * i) % 40000 + 100 for i in range(n)]
        row: dict[str, float] = {"tokens": n}
        for _ in range(3):  # interleaved, best of 3
            for name, loaded, num in (
                ("torch", on_torch, Numerics.EXACT),
                ("exact", on_kernels, Numerics.EXACT),
                ("fast", on_kernels, Numerics.FAST),
            ):
                row[name + "_s"] = min(
                    row.get(name + "_s", float("inf")), best_cpu(partial(forward, loaded, ids, num), 1)
                )
        out.append(row)
        print(
            f"prefill {n} tokens (CPU s): torch {row['torch_s']:.3f}, exact {row['exact_s']:.3f}, "
            f"fast {row['fast_s']:.3f}",
            file=sys.stderr,
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ms", default="1,4,8,16,32,64", help="batch sizes for the linears")
    p.add_argument("--prefill-lengths", default="379,512,1368")
    p.add_argument("--skip-prefill", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    np.random.seed(0)
    torch.manual_seed(0)
    from sluice.models.kernels import kernel_ops

    ops = kernel_ops()
    if ops is None:
        raise SystemExit("the kernels are unavailable on this machine")
    record = {
        "bench": "kernel_micro",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "isa": ops.isa(),
        "threads": args.threads,
        "linears": linears(ops, [int(m) for m in args.ms.split(",")]),
        "attention": attention(ops),
    }
    if not args.skip_prefill:
        record["prefill"] = prefill([int(n) for n in args.prefill_lengths.split(",")])
    print(json.dumps(record))


if __name__ == "__main__":
    main()
