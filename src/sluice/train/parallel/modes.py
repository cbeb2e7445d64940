"""The model-parallel modes: tensor parallel (tp), pipeline parallel (pp) and FSDP2 × tensor
parallel on a 2-D mesh (fsdp_tp); data parallelism (ddp, fsdp, ep) is parallel/wrap.py's.

Each mode returns the same `Wrapped` the training loop drives, with what differs filled in:
gradient clipping that knows how parameters are split (parallel/clip.py), and for a pipeline the
step itself (its schedule runs forward and backward over the micro-batches). Which share of the
global batch a rank trains on, and how many ranks report the same loss, are the run's parallel
degrees' (parallel/dims.py), and so is the mesh each mode shards over.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from sluice.train.model.causal_lm import parts
from sluice.train.parallel import pipeline
from sluice.train.parallel.clip import clipper
from sluice.train.parallel.comm_stats import CommStats
from sluice.train.parallel.dims import MODEL_PARALLEL, Parallel, ParallelDims
from sluice.train.parallel.fit import pipeline_micro_batches
from sluice.train.parallel.local import local_shard
from sluice.train.parallel.tensor import apply_tensor_parallel, count_traffic
from sluice.train.parallel.wrap import Wrapped, wrap
from sluice.train.settings import TrainSettings


def _tensor(module: torch.nn.Module, dims: ParallelDims, device: torch.device) -> Wrapped:
    apply_tensor_parallel(module, dims.build_mesh(device.type))
    stats = CommStats(timed=False)
    count_traffic(module, stats)
    return Wrapped(module, module, stats, nullcontext, clip=clipper(module, dims.world))


def _fsdp_tensor(module: torch.nn.Module, dims: ParallelDims, device: torch.device) -> Wrapped:
    from torch.distributed.fsdp import fully_shard

    mesh = dims.build_mesh(device.type)
    apply_tensor_parallel(module, mesh["tp"])
    for layer in parts(module).layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(module, mesh=mesh["dp"])
    stats = CommStats(timed=False)
    # FSDP2 per forward, as parallel/wrap.py estimates it: all-gather forward and backward and
    # reduce-scatter of what this tensor-parallel rank holds, 3·(dp−1)/dp of its unsharded bytes
    local = sum(local_shard(p).numel() * p.element_size() for p in module.parameters())
    count_traffic(module, stats, extra_per_forward=int(3 * local * (dims.dp - 1)))
    return Wrapped(module, module, stats, nullcontext, clip=clipper(module, dims.world))


def _pipeline(module: torch.nn.Module, settings: TrainSettings, device: torch.device) -> Wrapped:
    pipe = pipeline.build(module, device, settings.pp_schedule, pipeline_micro_batches(settings))

    stats = CommStats(timed=False)

    def step(batch, global_tokens: int) -> torch.Tensor:
        stats.bytes += pipeline.sent_bytes(pipe, *batch.tokens.shape)  # metrics.jsonl's comm_bytes
        return pipeline.train_step(pipe, batch.tokens, batch.mask, global_tokens)

    return Wrapped(
        pipe.stage, module, stats, nullcontext, train_step=step, clip=clipper(pipe.stage, 1, pipe.stage.shared_copies())
    )


def wrap_model(module: torch.nn.Module, settings: TrainSettings, dims: ParallelDims, device: torch.device) -> Wrapped:
    """The module ready to train under `settings.parallel` on `dims` (data parallel modes: wrap.wrap)."""
    if dims.parallel not in MODEL_PARALLEL:
        return wrap(module, dims, settings.compression, device)
    if dims.world < 2:
        raise RuntimeError(f"parallel = {dims.parallel.value} needs at least 2 ranks")
    if dims.parallel is Parallel.TP:
        return _tensor(module, dims, device)
    if dims.parallel is Parallel.FSDP_TP:
        return _fsdp_tensor(module, dims, device)
    return _pipeline(module, settings, device)
