#!/usr/bin/env python3
"""What the test-only fault seams cost a step when no fault is given (issue 41 §3).

A training step passes two fault points (`Trainer._fault`: the step's start and after its
backward pass) and an engine step one (`LLMEngine._execute`). This times exactly those calls,
with SLUICE_TRAIN_FAULT unset, on stand-ins for the trainer and engine (the calls read only the
attributes given here), in this tree and in another checkout's, side by side: each tree runs in
child processes, alternating, and the best of the rounds is kept.

    PYTHONPATH=src .venv/bin/python bench/train/fault_seam.py --other /path/to/old/checkout/src

Prints JSON: nanoseconds per training step (both points; beside it, two calls of a method that
does nothing, the floor) and per engine step, for each tree.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/<system>/x.py → the root
from bench.common import log

CALLS = 200_000


def _best_ns(fn, calls: int = CALLS, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / calls)
    return best


def measure() -> dict[str, float]:
    """In this process, on whichever sluice PYTHONPATH names."""
    import torch

    from sluice.engine.engine import LLMEngine
    from sluice.train.faults import FaultPoint
    from sluice.train.trainer import Trainer

    os.environ.pop("SLUICE_TRAIN_FAULT", None)
    trainer = SimpleNamespace(
        rank=0,
        dims=SimpleNamespace(world=1),
        stop=SimpleNamespace(set=False),
        ckpt=SimpleNamespace(wait=lambda: None),
        model=SimpleNamespace(module=torch.nn.Linear(4, 4)),
        run_dir=Path("."),
        group=0,
        faults=None,
    )  # faults: this tree's Trainer read none
    loss = torch.zeros((), dtype=torch.float64)

    def train_step() -> None:
        Trainer._fault(trainer, FaultPoint.STEP_START, 3)  # type: ignore[arg-type]
        Trainer._fault(trainer, FaultPoint.AFTER_BACKWARD, 3, loss)  # type: ignore[arg-type]

    out = SimpleNamespace(chunks=[SimpleNamespace(request=SimpleNamespace(seed=None))] * 8)
    engine = SimpleNamespace(
        runner=SimpleNamespace(execute=lambda o: o), config=SimpleNamespace(fault_fail_seed=None)
    )  # what an earlier tree read

    def engine_step() -> None:
        LLMEngine._execute(engine, out)  # type: ignore[arg-type]

    def noop(self, point, step, loss_sum=None) -> None:
        return None

    def bare_calls() -> None:  # the floor: two calls of a method that does nothing
        noop(trainer, FaultPoint.STEP_START, 3)
        noop(trainer, FaultPoint.AFTER_BACKWARD, 3, loss)

    return {
        "train_step_ns": round(_best_ns(train_step, CALLS // 10), 1),
        "two_empty_calls_ns": round(_best_ns(bare_calls, CALLS // 10), 1),
        "engine_step_ns": round(_best_ns(engine_step), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--other", help="another checkout's src/ to measure beside this tree's")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    here = str(Path(__file__).resolve().parents[2] / "src")
    trees = {"this": here, **({"other": args.other} if args.other else {})}
    best: dict[str, dict[str, float]] = {}
    for r in range(args.rounds):
        for name, src in trees.items():
            env = {**os.environ, "PYTHONPATH": src}
            env.pop("SLUICE_TRAIN_FAULT", None)
            got = json.loads(
                subprocess.run(
                    [sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True
                ).stdout
            )
            log(f"round {r + 1}: {name} {got}")
            best[name] = {k: min(v, best.get(name, {}).get(k, float("inf"))) for k, v in got.items()}
    print(json.dumps(best, indent=1))


if __name__ == "__main__":
    main()
