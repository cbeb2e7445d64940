"""DDP communication hooks: plain all-reduce, fp16, bf16, PowerSGD and top-K, each counting bytes.

Every hook receives one gradient bucket, returns a future of the averaged bucket, and adds the
bytes it handed to the collective (after compression) and the time to completion to CommStats.
- fp16 / bf16: cast, all-reduce, cast back (half the bytes). torch's bf16_compress_hook refuses
  CPU ("requires CUDA 11+ and NCCL 2.10+"), so both casts are written here; gloo reduces bf16.
- PowerSGD (torch's hook, rank 2, error feedback, warm start): low-rank P·Qᵀ per matrix after
  two uncompressed steps; its bytes are counted from the shapes it sends.
- top-K (1 % of each bucket, error feedback): each rank sends its largest-magnitude entries and
  their indices (all-gather); what it did not send is added to its next step's gradient, so no
  gradient is lost, only delayed. The first step is sent whole (DDP rebuilds its buckets after it).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from sluice.train.parallel.comm_stats import CommStats
from sluice.train.settings import Compression

if TYPE_CHECKING:
    from torch.nn.parallel import DistributedDataParallel

TOPK_RATIO = 0.01
POWERSGD_RANK = 2


def _timed(stats: CommStats, fut: torch.futures.Future, started: float, finish) -> torch.futures.Future:
    def done(f: torch.futures.Future) -> torch.Tensor:
        out = finish(f.value())
        stats.record(started, time.perf_counter())
        return out

    return fut.then(done)


def _cast_hook(dtype: torch.dtype | None):
    def hook(stats, bucket):  # unannotated: DDP checks hook annotations literally
        started = time.perf_counter()
        buf = bucket.buffer()
        world = dist.get_world_size()
        send = (buf if dtype is None else buf.to(dtype)).div_(world)
        stats.bytes += send.numel() * send.element_size()
        fut = dist.all_reduce(send, async_op=True).get_future()

        def finish(value: list[torch.Tensor]) -> torch.Tensor:
            reduced = value[0]
            if dtype is not None:
                buf.copy_(reduced)
                return buf
            return reduced

        return _timed(stats, fut, started, finish)

    return hook


class _TopK:
    def __init__(self, stats: CommStats, ratio: float):
        self.stats, self.ratio = stats, ratio
        self.errors: dict[int, torch.Tensor] = {}
        self.iteration = 0
        self._plain = _cast_hook(None)

    def __call__(self, bucket):
        # DDP rebuilds its buckets (order and membership) after the first backward, so a
        # residual kept by bucket index is valid from the second step on: the first is sent whole
        if self.iteration == 0:
            if bucket.is_last():
                self.iteration += 1
            return self._plain(self.stats, bucket)
        if bucket.is_last():
            self.iteration += 1
        started = time.perf_counter()
        buf = bucket.buffer()
        world = dist.get_world_size()
        err = self.errors.get(bucket.index())
        full = buf + err if err is not None and err.shape == buf.shape else buf.clone()
        k = max(1, math.ceil(self.ratio * full.numel()))
        idx = full.abs().topk(k, sorted=False).indices
        values = full[idx]
        full[idx] = 0
        self.errors[bucket.index()] = full  # the residual: sent next step
        # values and indices in one float tensor: the int32 indices travel as their bit pattern
        packed = torch.cat([values.float(), idx.to(torch.int32).view(torch.float32)])
        gathered = [torch.empty_like(packed) for _ in range(world)]
        self.stats.bytes += packed.numel() * packed.element_size()
        fut = dist.all_gather(gathered, packed, async_op=True).get_future()

        def finish(_value) -> torch.Tensor:
            out = torch.zeros_like(buf)
            for part in gathered:  # filled in place by the completed all-gather
                out.index_add_(0, part[k:].view(torch.int32).long(), part[:k].to(out.dtype))
            return out.div_(world)

        return _timed(self.stats, fut, started, finish)


class _PowerSGD:
    def __init__(self, stats: CommStats):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps

        self.ps = ps
        self.stats = stats
        self.state = ps.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )

    def _bytes(self, bucket: dist.GradBucket) -> int:
        if self.state.iter < self.state.start_powerSGD_iter:
            return bucket.buffer().numel() * bucket.buffer().element_size()
        total = 0
        for t in bucket.gradients():
            if t.ndim > 1:
                n, m = t.shape[0], t.numel() // t.shape[0]
                r = min(n, m, POWERSGD_RANK)
                total += (n + m) * r * t.element_size()
            else:
                total += t.numel() * t.element_size()
        return total

    def __call__(self, bucket):
        started = time.perf_counter()
        self.stats.bytes += self._bytes(bucket)
        return _timed(self.stats, self.ps.powerSGD_hook(self.state, bucket), started, lambda v: v)


def _stateful_hook(state, bucket):  # DDP wants a function (it reads __name__): the state does the work
    return state(bucket)


def register_hook(ddp: DistributedDataParallel, compression: Compression, stats: CommStats) -> object:
    """Register `compression`'s hook on `ddp`; returns the hook's state (top-K's residuals, ...)."""
    if compression in (Compression.TOPK, Compression.POWERSGD):
        state = _TopK(stats, TOPK_RATIO) if compression is Compression.TOPK else _PowerSGD(stats)
        ddp.register_comm_hook(state, _stateful_hook)
        return state
    dtype = {Compression.NONE: None, Compression.FP16: torch.float16, Compression.BF16: torch.bfloat16}[compression]
    ddp.register_comm_hook(stats, _cast_hook(dtype))
    return stats
