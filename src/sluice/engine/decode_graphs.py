"""CUDA graphs for decode-only steps: capture once per (batch, block-count) bucket, then replay.

A decode step of a small model on a GPU is launch-bound: ~15 kernels a layer, each a few
microseconds of work behind a few microseconds of Python and launch. A captured graph replays
all of a step's kernels in one launch. A graph replays fixed shapes and fixed addresses, so:

- the step's inputs live in static device buffers the graph was captured on: one int64 buffer
  (token ids, positions, slot mapping) and one int32 buffer (block tables, context lengths);
  each step's host-built values are copied into them (one asynchronous copy per dtype, as
  engine/staging.py does for the eager path) before the replay;
- the batch is padded up to the next bucket (1, 2, 4, ... up to max_num_seqs) and the block
  tables to the next power-of-two block count (at least MIN_BLOCKS, at most the context
  window's): padded rows read token 0 at position 0, write their K/V into the null block's
  slot 0 (block 0 is never handed out, engine/block_pool.py), and attend over one slot;
  padded table columns point at the null block under the -inf mask, as in the eager layout;
- the attention layout (slots, mask) is computed inside the graph from the static block tables
  and context lengths (AttentionMetadata with max_context_len = the bucket's width and
  min_context_len = 0, so `prepare` never reads the device and always builds the mask).

Graphs are captured lazily, the first time a bucket is needed, into one shared memory pool
(only one replays at a time). Steps with a prefill chunk, or past the largest bucket, run
eagerly. Off by default (EngineConfig.cuda_graphs) and never on the CPU; the padding and the
static-buffer plumbing are tested on the CPU with an eager stand-in for the capture
(tests/unit/engine/test_decode_graphs.py), the capture itself in tests/unit/models/test_gpu.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from sluice.engine.scheduler import ScheduledChunk
from sluice.models.attention import AttentionMetadata
from sluice.models.llama import LlamaModel

log = logging.getLogger(__name__)

MIN_BLOCKS = 16  # the narrowest block-table bucket: 128 tokens at the default block size


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two from 1 up to the first one >= max_batch."""
    out = [1]
    while out[-1] < max_batch:
        out.append(out[-1] * 2)
    return out


def batch_bucket(n: int, max_batch: int) -> int | None:
    """The captured batch size a step of `n` decodes pads to; None past the largest."""
    if n < 1:
        return None
    return next((b for b in batch_buckets(max_batch) if b >= n), None)


def block_bucket(nblocks: int, max_blocks: int, minimum: int = MIN_BLOCKS) -> int | None:
    """The block-table width a step whose longest context spans `nblocks` blocks pads to: the
    next power of two (>= minimum), capped at `max_blocks`; None past `max_blocks`."""
    if nblocks > max_blocks:
        return None
    width = minimum
    while width < nblocks:
        width *= 2
    return min(width, max_blocks)


@dataclass(slots=True)
class PaddedDecode:
    """A decode step's inputs on the host, padded to a bucket, in the static buffers' layout."""

    batch: int  # the bucket's batch size (rows >= num_decodes are padding)
    blocks: int  # the bucket's block-table width
    num_decodes: int
    longs: torch.Tensor  # [3 * batch] int64: token ids, positions, slot mapping
    ints: torch.Tensor  # [batch * blocks + batch] int32: block tables (row-major), context lengths


def pad_decodes(chunks: Sequence[ScheduledChunk], block_size: int, batch: int, blocks: int) -> PaddedDecode:
    """Host tensors of a decode-only step, padded to (batch, blocks); see the module docstring."""
    n = len(chunks)
    assert 0 < n <= batch, f"{n} decodes do not fit a bucket of {batch}"
    ids = [0] * batch
    positions = [0] * batch
    slots = [0] * batch  # padding writes the null block's slot 0
    table = [0] * (batch * blocks)
    lens = [1] * batch  # padding attends over that one slot: no all -inf row
    for i, c in enumerate(chunks):
        p = c.start
        ids[i] = c.request.all_token_ids[p]
        positions[i] = p
        slots[i] = c.block_ids[p // block_size] * block_size + p % block_size
        row = c.block_ids[:blocks]
        assert c.end <= blocks * block_size, "a context wider than the bucket"
        table[i * blocks : i * blocks + len(row)] = row
        lens[i] = c.end
    return PaddedDecode(
        batch,
        blocks,
        n,
        torch.tensor(ids + positions + slots, dtype=torch.int64),
        torch.tensor(table + lens, dtype=torch.int32),
    )


class Replayable(Protocol):
    out: torch.Tensor  # the captured step's logits [batch, vocab]

    def replay(self) -> None: ...


Capture = Callable[[Callable[[], torch.Tensor]], Replayable]


class CudaGraphCapture:
    """torch.cuda.CUDAGraph capture into one pool shared by every bucket."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def __call__(self, fn: Callable[[], torch.Tensor]) -> Replayable:
        # warm up on a side stream first (cuBLAS handles, SDPA's kernel choice, the allocator),
        # as torch's documentation of graph capture asks
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        return _CudaGraph(fn, self.pool)


class _CudaGraph:
    def __init__(self, fn: Callable[[], torch.Tensor], pool: torch.cuda._POOL_HANDLE):
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn()

    def replay(self) -> None:
        self.graph.replay()


class EagerReplay:
    """A stand-in for the capture that re-runs the function on the static buffers: the same
    padding, buffers and layout as a graph, on any device (the CPU tests of this module)."""

    def __init__(self, fn: Callable[[], torch.Tensor]):
        self.fn = fn
        self.out = fn()

    def replay(self) -> None:
        self.out = self.fn()


class DecodeGraphs:
    """The captured decode steps of one runner (its model and KV caches)."""

    def __init__(
        self,
        model: LlamaModel,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        max_batch: int,
        max_blocks: int,
        capture: Capture | None = None,
    ):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.max_batch = batch_buckets(max_batch)[-1]
        self.max_blocks = max_blocks
        if capture is None:
            if model.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a CUDA device; the model is on {model.device}")
            capture = CudaGraphCapture()
        self.capture = capture
        device = model.device
        self.longs = torch.zeros(3 * self.max_batch, dtype=torch.int64, device=device)
        self.ints = torch.zeros(self.max_batch * (max_blocks + 1), dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], Replayable] = {}
        self.replays = 0  # steps run through a graph (read by the benchmarks and tests)
        # a capture that raised turns graphs off for this engine (the step and every later one
        # run eagerly) rather than failing requests; the benchmarks report it
        self.failure: str | None = None

    def bucket(self, chunks: Sequence[ScheduledChunk]) -> tuple[int, int] | None:
        """(batch, blocks) for a decode-only step that fits a bucket, else None (run eagerly)."""
        # a speculative decode has several rows per request: eager (its rows are not a bucket's)
        if self.failure is not None or not chunks or not all(c.is_decode and not c.spec_token_ids for c in chunks):
            return None
        batch = batch_bucket(len(chunks), self.max_batch)
        blocks = block_bucket(-(-max(c.end for c in chunks) // self.block_size), self.max_blocks)
        return None if batch is None or blocks is None else (batch, blocks)

    def run(self, chunks: Sequence[ScheduledChunk], key: tuple[int, int]) -> torch.Tensor | None:
        """The step's logits [len(chunks), vocab] fp32 through the bucket's graph; None if the
        capture failed (the caller runs the step eagerly)."""
        step = pad_decodes(chunks, self.block_size, *key)
        self._load(step)
        graph = self.graphs.get(key)
        if graph is None:  # capture with this step's own inputs loaded: the warm-up runs
            # rewrite the same K/V into the same slots, and padding touches only the null block
            try:
                graph = self.graphs[key] = self.capture(self._step_fn(*key))
            except Exception as exc:
                self.failure = f"bucket {key}: {type(exc).__name__}: {exc}"
                log.exception("CUDA graph capture failed for bucket %s; decode steps run eagerly from now on", key)
                return None
        graph.replay()
        self.replays += 1
        return graph.out[: step.num_decodes]

    def _load(self, step: PaddedDecode) -> None:
        pin = self.longs.device.type == "cuda"
        for static, host in ((self.longs, step.longs), (self.ints, step.ints)):
            static[: host.numel()].copy_(host.pin_memory() if pin else host, non_blocking=pin)

    def _step_fn(self, batch: int, blocks: int) -> Callable[[], torch.Tensor]:
        longs, ints, bs = self.longs, self.ints, self.block_size
        ids, positions, slots = longs[:batch], longs[batch : 2 * batch], longs[2 * batch : 3 * batch]
        tables = ints[: batch * blocks].view(batch, blocks)
        lens = ints[batch * blocks : batch * blocks + batch]
        rows = torch.arange(batch, device=longs.device)

        def step() -> torch.Tensor:
            meta = AttentionMetadata(
                slot_mapping=slots,
                num_decodes=batch,
                block_tables=tables,
                context_lens=lens,
                block_size=bs,
                max_context_len=blocks * bs,
                min_context_len=0,
            )
            return self.model.forward(ids, positions, meta, self.kv_caches, rows)

        return step
