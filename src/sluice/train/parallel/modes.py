"""The model-parallel modes: tensor parallel (tp), pipeline parallel (pp) and FSDP2 × tensor
parallel on a 2-D mesh (fsdp_tp); data parallelism (ddp, fsdp) is parallel/wrap.py's.

Each mode returns the same `Wrapped` the training loop drives, with what differs filled in:
which share of the global batch a rank trains on (a tensor-parallel group shares its rows, a
pipeline's stages all see the whole batch), how many ranks report the same loss, gradient
clipping that knows how parameters are split (parallel/clip.py), and for a pipeline the step
itself (its schedule runs forward and backward over the micro-batches).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from sluice.train.parallel import pipeline
from sluice.train.parallel.clip import clipper
from sluice.train.parallel.fit import pipeline_micro_batches
from sluice.train.parallel.comm_stats import CommStats
from sluice.train.parallel.tensor import apply_tensor_parallel, count_traffic
from sluice.train.parallel.wrap import Wrapped, wrap
from sluice.train.settings import Parallel, TrainSettings

MODEL_PARALLEL = (Parallel.TP, Parallel.PP, Parallel.FSDP_TP)


def _tensor(module: torch.nn.Module, device: torch.device) -> Wrapped:
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    apply_tensor_parallel(module, init_device_mesh(device.type, (world,), mesh_dim_names=("tp",)))
    stats = CommStats(timed=False)
    count_traffic(module, stats)
    return Wrapped(module, module, stats, nullcontext, dp_rank=0, dp_size=1,
                   loss_copies=world, clip=clipper(module, world))


def _fsdp_tensor(module: torch.nn.Module, device: torch.device, tp: int) -> Wrapped:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    if world % tp:
        raise RuntimeError(f"fsdp_tp: the world size {world} is not a multiple of tp_size {tp}")
    mesh = init_device_mesh(device.type, (world // tp, tp), mesh_dim_names=("dp", "tp"))
    apply_tensor_parallel(module, mesh["tp"])
    for layer in module.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(module, mesh=mesh["dp"])
    stats = CommStats(timed=False)
    # FSDP2 per forward, as parallel/wrap.py estimates it: all-gather forward and backward and
    # reduce-scatter of what this tensor-parallel rank holds, 3·(dp−1)/dp of its unsharded bytes
    dp = world // tp
    local = sum(p.to_local().numel() * p.element_size() for p in module.parameters())
    count_traffic(module, stats, extra_per_forward=int(3 * local * (dp - 1)))
    return Wrapped(module, module, stats, nullcontext, dp_rank=mesh["dp"].get_local_rank(),
                   dp_size=world // tp, loss_copies=tp, clip=clipper(module, world))


def _pipeline(module: torch.nn.Module, settings: TrainSettings, device: torch.device) -> Wrapped:
    pipe = pipeline.build(module, device, settings.pp_schedule, pipeline_micro_batches(settings))

    stats = CommStats(timed=False)

    def step(batch, global_tokens: int) -> torch.Tensor:
        stats.bytes += pipeline.sent_bytes(pipe, *batch.tokens.shape)  # metrics.jsonl's comm_bytes
        return pipeline.train_step(pipe, batch.tokens, batch.mask, global_tokens)

    return Wrapped(pipe.stage, module, stats, nullcontext, dp_rank=0, dp_size=1, loss_copies=1,
                   train_step=step, clip=clipper(pipe.stage, 1, pipe.stage.shared_copies()))


def wrap_model(module: torch.nn.Module, settings: TrainSettings, device: torch.device) -> Wrapped:
    """The module ready to train under `settings.parallel` (data parallel modes: wrap.wrap)."""
    if settings.parallel not in MODEL_PARALLEL:
        return wrap(module, settings.parallel, settings.compression, device)
    if not dist.is_initialized() or dist.get_world_size() < 2:
        raise RuntimeError(f"parallel = {settings.parallel.value} needs at least 2 ranks")
    if settings.parallel is Parallel.TP:
        return _tensor(module, device)
    if settings.parallel is Parallel.FSDP_TP:
        return _fsdp_tensor(module, device, settings.tensor_parallel_size(dist.get_world_size()))
    return _pipeline(module, settings, device)
