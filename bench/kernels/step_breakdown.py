#!/usr/bin/env python3
"""Where a batch-N decode step goes, on the CPU kernels (issue 25, "Throughput under load").

One engine on the bundled model, N greedy requests (~100-token chat prompts, EOS ignored) on
1 torch thread; once every request decodes, each of --steps decode steps is cut into parts by
timers around them, in **thread CPU time** (what the step costs a core, whatever else holds the
cores of this shared machine) and wall time:

  linear:qkv / o / gate_up / down   the kernel linears of the 30 layers, by weight
  linear:head                        the LM head (tied Q8_0 embedding)
  attention                          decode attention through the block tables
  rope+cache                         RoPE of q and k fused with the K/V cache write
  glue                               RMSNorm + residual adds, SiLU·mul, the embedding lookup,
                                     the logits-row gather (the fused forward's other calls)
  sampling                           models/sampler.sample (greedy: one argmax over [N, vocab])
  prepare                            ModelRunner.prepare (host-side tensors of the step)
  engine                             the rest of LLMEngine.step: scheduler, KV blocks, events

Then the same linears once more in isolation at M = N: the exact kernel against oneDNN-prepacked
fp32 on the dequantized weights (best of --reps, CPU time), and their sum over the model.

    PYTHONPATH=src .venv/bin/python bench/kernels/step_breakdown.py                # 32 streams
    PYTHONPATH=src .venv/bin/python bench/kernels/step_breakdown.py --streams 8 --steps 10
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.openmp_wait import sleep_when_idle

sleep_when_idle()  # torch's OpenMP as in a worker: set before torch loads (sluice/openmp_wait.py)

import torch

if TYPE_CHECKING:
    from sluice.models.attention import AttentionMetadata
    from sluice.models.lora.batch import LoraBatch

PARTS = (
    "linear:qkv",
    "linear:o",
    "linear:gate_up",
    "linear:down",
    "linear:head",
    "attention",
    "rope+cache",
    "glue",
    "sampling",
    "prepare",
    "engine",
)


class Clock:
    """Accumulates thread CPU and wall seconds per part."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = collections.defaultdict(float)
        self.wall: dict[str, float] = collections.defaultdict(float)

    def time(self, part: str, fn: Callable, *args, **kwargs):
        c, t = time.thread_time(), time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.cpu[part] += time.thread_time() - c
            self.wall[part] += time.perf_counter() - t

    def wrap(self, part: str, fn: Callable) -> Callable:
        return lambda *a, **k: self.time(part, fn, *a, **k)

    def reset(self) -> None:
        self.cpu.clear()
        self.wall.clear()


def instrument(clock: Clock) -> None:
    """Swaps in a timed copy of the kernels' fused forward (same calls, same order) and timed
    prepare / sample; the numbers the step computes do not change."""
    import sluice.engine.runner as runner_mod
    import sluice.models.kernels.fused_forward as ff

    def fused_forward(  # the signature of ff.fused_forward, which LlamaModel.forward calls
        model: Any,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_indices: torch.Tensor,
        fast: bool,
        argmax_rows: torch.Tensor | None = None,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        assert lora is None, "the breakdown times the base model's steps (no adapters)"
        ops, cfg, tm = model.ops, model.config, clock.time
        eps = cfg.rms_norm_eps
        heads, kv_heads, head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        cos, sin = model.rope_cos, model.rope_sin
        attention = model.attention
        hot = input_ids.shape[0] <= ops.DECODE_MAX_ROWS  # the helpers spin through a decode step, as served
        if hot:
            ops.set_pool_hot(True)
        try:
            h = tm("glue", model.embed_rows, input_ids)
            delta = None
            for layer, (k_cache, v_cache) in zip(model.layers, kv_caches):
                x = tm("glue", ops.add_rms_norm, h, delta, layer.input_norm, eps)
                qkv = tm("linear:qkv", layer.qkv, x, fast)
                tm(
                    "rope+cache",
                    ops.rope_and_cache,
                    qkv,
                    positions,
                    cos,
                    sin,
                    meta.slot_mapping,
                    k_cache,
                    v_cache,
                    heads,
                    kv_heads,
                    head_dim,
                )
                attn = tm("attention", attention.attend, qkv, k_cache, v_cache, meta)
                o = tm("linear:o", layer.o, attn, fast)
                x = tm("glue", ops.add_rms_norm, h, o, layer.post_norm, eps)
                gu = tm("linear:gate_up", layer.gate_up, x, fast)
                act = tm("glue", ops.silu_mul, gu)
                delta = tm("linear:down", layer.down, act, fast)
            rows = tm("glue", lambda: h.index_select(0, logits_indices))
            d = None if delta is None else tm("glue", lambda: delta.index_select(0, logits_indices))
            x = tm("glue", ops.add_rms_norm, rows, d, model.norm, eps)
            if argmax_rows is not None and hasattr(model.lm_head, "argmax_logits"):
                # the greedy head (csrc/greedy_head.h), as the fused forward calls it
                return tm("linear:head", model.lm_head.argmax_logits, x, argmax_rows)
            return tm("linear:head", model.lm_head, x)
        finally:
            if hot:
                ops.set_pool_hot(False)

    ff.fused_forward = fused_forward
    runner_mod.sample = clock.wrap("sampling", runner_mod.sample)
    prepare = runner_mod.ModelRunner.prepare
    # instrumentation: the runner's own method, timed (the benchmark's point, not a typing slip)
    runner_mod.ModelRunner.prepare = lambda self, out: clock.time("prepare", prepare, self, out)  # type: ignore[method-assign]


def decode_steps(engine, clock: Clock, streams: int, steps: int, basis: str) -> list[dict]:
    """Steps until every request decodes, then records `steps` decode steps' parts, in thread CPU
    time (basis "cpu") or wall time ("wall")."""
    rows: list[dict] = []
    while engine.has_unfinished() and len(rows) < steps:
        clock.reset()
        c, t = time.thread_time(), time.perf_counter()
        engine.step()
        cpu, wall = time.thread_time() - c, time.perf_counter() - t
        s = engine.stats()
        if not (s.last_step_tokens == s.last_step_seqs == streams):
            continue
        row = {"cpu_ms": 1e3 * cpu, "wall_ms": 1e3 * wall}
        parts = clock.cpu if basis == "cpu" else clock.wall
        for p in PARTS[:-1]:
            row[p] = 1e3 * parts.get(p, 0.0)
        row["engine"] = row[f"{basis}_ms"] - sum(row[p] for p in PARTS[:-1])
        rows.append(row)
    return rows


def isolated_linears(model, m: int, reps: int) -> list[dict]:
    """Each distinct linear shape of the model at M = m: the kernel vs oneDNN fp32, CPU time."""
    from sluice.models.linear import Linear

    def best(fn: Callable) -> float:
        fn()
        out = float("inf")
        for _ in range(reps):
            c = time.thread_time()
            fn()
            out = min(out, time.thread_time() - c)
        return out

    layer = model.layers[0]
    n_layers = len(model.layers)
    out = []
    for name, lin, count in (
        ("qkv", layer.qkv, n_layers),
        ("o", layer.o, n_layers),
        ("gate_up", layer.gate_up, n_layers),
        ("down", layer.down, n_layers),
        ("head", model.lm_head, 1),
    ):
        x = torch.randn(m, lin.in_features)
        dense = Linear(_dequantized(model, lin))
        k, d = best(partial(lin, x)), best(partial(dense, x))
        out.append(
            {
                "linear": name,
                "N": lin.out_features,
                "K": lin.in_features,
                "count": count,
                "kernel_us": 1e6 * k,
                "onednn_us": 1e6 * d,
                "kernel_gflops": 2 * m * lin.out_features * lin.in_features / k / 1e9,
            }
        )
    return out


def _dequantized(model, lin) -> torch.Tensor:
    """The fp32 weight of a packed linear, read back through the kernel (x = I gives W^T exactly:
    the kernels' identity property, tests/unit/models/test_kernels.py)."""
    eye = torch.eye(lin.in_features)
    return lin(eye).t().contiguous()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--steps", type=int, default=20, help="decode steps recorded (default 20)")
    p.add_argument("--out-tokens", type=int, default=48)
    p.add_argument("--reps", type=int, default=7, help="repetitions of each isolated linear (best of)")
    p.add_argument("--skip-linears", action="store_true")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1). Above 1 the decode calls split over the kernels' helper pool "
        "(the engine's default cut) and the parts are given in wall time, which then is what they cost",
    )
    p.add_argument("--json", help="write every figure here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.*
    from bench.serving.engine_throughput import prompts, submit
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model

    clock = Clock()
    instrument(clock)
    loaded = load_model(progress=False)
    engine = LLMEngine(loaded, EngineConfig())
    model = engine.runner.model
    assert model.ops is not None, "the CPU kernels are not in use: nothing to break down"
    submit(engine, prompts(loaded.tokenizer, args.streams), max(args.out_tokens, args.steps + 8))
    basis = "cpu" if args.threads == 1 else "wall"
    rows = decode_steps(engine, clock, args.streams, args.steps, basis)
    while engine.has_unfinished():
        engine.step()
    print(
        f"decode steps at {args.streams} streams: {len(rows)} recorded, {args.threads} thread(s), parts in {basis} "
        f"time, load average "
        f"{' '.join(f'{x:.1f}' for x in __import__('os').getloadavg())}"
    )
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    total = med[f"{basis}_ms"]
    print(
        f"step: CPU {total:.1f} ms median (min {min(r['cpu_ms'] for r in rows):.1f}), wall {med['wall_ms']:.1f} ms; "
        f"{args.streams * 1000 / total:.0f} tok/s per {'busy core' if basis == 'cpu' else 'second'}"
    )
    print(f"{'part':16s} {basis + ' ms':>8s} {'share':>6s}   (median over steps; min-max)")
    for part in PARTS:
        vals = [r[part] for r in rows]
        print(f"{part:16s} {med[part]:8.2f} {100 * med[part] / total:5.1f}%   ({min(vals):.2f}-{max(vals):.2f})")
    lin = sum(med[p] for p in PARTS if p.startswith("linear"))
    print(f"{'linears (all)':16s} {lin:8.2f} {100 * lin / total:5.1f}%")
    result: dict = {"streams": args.streams, "steps": rows, "median": med}
    if not args.skip_linears:
        print(f"\nisolated linears at M = {args.streams} (best of {args.reps}, CPU time):")
        iso = isolated_linears(model, args.streams, args.reps)
        for r in iso:
            print(
                f"  {r['linear']:8s} {r['N']:6d}x{r['K']:<5d} kernel {r['kernel_us']:8.0f} us  oneDNN fp32 "
                f"{r['onednn_us']:8.0f} us  ({r['onednn_us'] / r['kernel_us']:.2f}x)  {r['kernel_gflops']:.1f} GFLOP/s"
            )
        k = sum(r["kernel_us"] * r["count"] for r in iso) / 1e3
        d = sum(r["onednn_us"] * r["count"] for r in iso) / 1e3
        print(f"  per step: kernel {k:.1f} ms, oneDNN fp32 {d:.1f} ms")
        result["linears"] = iso
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
