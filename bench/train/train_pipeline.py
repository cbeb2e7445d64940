"""The pipeline bubble as micro-batches grow: measured against (p − 1) / (m + p − 1).

    PYTHONPATH=src python bench/train/train_pipeline.py [--micro 1,2,4,8,16] [--steps 3]

Two processes on gloo (one torch thread each, the two stages of sluice's pipeline,
train/parallel/pipeline.py) train a random Llama (8 decoder layers split 4 + 4, small vocabulary
so the layers dominate) on one fixed global batch, split into m micro-batches, under GPipe and
1F1B. Each rank times its compute (torch's `forward_one_chunk` / `backward_one_chunk`, which
the schedules call after the receives they wait on) and the step's wall time (until the slower
stage ends): the measured bubble is the idle share, 1 − compute / step, averaged over the
stages, printed beside the ideal (p − 1) / (m + p − 1). Both are taken in the same step, so the
machine's other load inflates them together. Losses of every schedule and m must equal one
process's (the script fails otherwise): the bench doubles as the GPipe check.
Medians of `--steps` steps after one warm-up; the optimizer step is left out (the same with or
without a pipeline).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SEQ, ROWS, VOCAB = 64, 16, 512
SHAPE = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=SEQ,
)


def _model():
    import transformers

    config = transformers.LlamaConfig(**SHAPE, vocab_size=VOCAB, tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, dtype=torch.float32, attn_implementation="sdpa")


def _batch():
    from sluice.train.step import Batch

    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (ROWS, SEQ), generator=g)
    return Batch(tokens, torch.ones_like(tokens, dtype=torch.bool))


BUSY = [0.0]  # this rank's compute seconds in the current step


def _count_compute() -> None:
    from torch.distributed.pipelining.stage import _PipelineStageBase

    def timed(fn):
        def run(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                BUSY[0] += time.perf_counter() - t0

        return run

    # the benchmark times torch's stage methods by replacing them on the class (on purpose)
    _PipelineStageBase.forward_one_chunk = timed(_PipelineStageBase.forward_one_chunk)  # type: ignore[method-assign]
    _PipelineStageBase.backward_one_chunk = timed(_PipelineStageBase.backward_one_chunk)  # type: ignore[method-assign]


def _one_process_loss() -> float:
    from contextlib import nullcontext

    from sluice.train.step import forward_backward

    batch = _batch()
    n_tok = int(batch.mask[:, 1:].sum())
    return forward_backward(_model(), nullcontext, batch, ROWS, n_tok, 1).item() / n_tok


def _pipelined(schedule, micro_batches: int, steps: int) -> tuple[float, float, float]:
    """(median step seconds, median idle share averaged over the stages, the loss)."""
    from sluice.train.parallel import pipeline

    pipe = pipeline.build(_model(), torch.device("cpu"), schedule, micro_batches)
    batch = _batch()
    n_tok = int(batch.mask[:, 1:].sum())
    times, idles, loss = [], [], 0.0
    for i in range(steps + 1):
        dist.barrier()
        BUSY[0] = 0.0
        t0 = time.perf_counter()
        part = pipeline.train_step(pipe, batch.tokens, batch.mask, n_tok)
        mine = time.perf_counter() - t0
        wall = torch.tensor([mine])
        dist.all_reduce(wall, op=dist.ReduceOp.MAX)  # the step ends when the slower stage does
        idle = torch.tensor([1 - BUSY[0] / wall.item()])
        dist.all_reduce(idle)
        dist.all_reduce(part)
        loss = part.item() / n_tok
        pipe.stage.zero_grad(set_to_none=True)
        if i:
            times.append(wall.item())
            idles.append(idle.item() / dist.get_world_size())
    return statistics.median(times), statistics.median(idles), loss


def _worker(rank: int, world: int, port: int, micros: list[int], steps: int) -> None:
    from sluice.train.parallel.dims import PipelineSchedule as Schedule
    from sluice.train.parallel.fit import bubble_fraction

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    _count_compute()
    ref_loss = _one_process_loss()
    rows = []
    for m in micros:
        for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
            if schedule is Schedule.ONE_F_ONE_B and m < world:
                continue  # 1F1B needs m >= p
            step, idle, loss = _pipelined(schedule, m, steps)
            if abs(loss - ref_loss) > 1e-5 * abs(ref_loss):
                raise SystemExit(f"{schedule.value} m={m}: loss {loss} != one process {ref_loss}")
            rows.append((m, schedule.value, step, idle, bubble_fraction(world, m)))
    if rank == 0:
        print(
            f"{world} stages x {SHAPE['num_hidden_layers'] // world} layers (hidden {SHAPE['hidden_size']}), "
            f"batch {ROWS} x {SEQ} tokens, gloo, 1 thread per rank, median of {steps} steps; "
            "losses equal one process's (rel 1e-5) for every row\n"
        )
        print("| m | schedule | step (ms) | bubble measured | (p−1)/(m+p−1) |")
        print("|---:|---|---:|---:|---:|")
        for m, name, step, idle, ideal in rows:
            print(f"| {m} | {name} | {step * 1e3:.0f} | {idle:.2f} | {ideal:.2f} |")
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--micro", default="1,2,4,8,16", help="micro-batch counts (each divides the 16 rows)")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    micros = [int(x) for x in args.micro.split(",")]
    if any(ROWS % m for m in micros):
        ap.error(f"every micro-batch count must divide {ROWS}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, micros, args.steps), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
