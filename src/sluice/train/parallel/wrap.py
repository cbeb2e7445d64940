"""Wrap the full model for data parallelism: DDP (all-reduce) or FSDP2 (fully_shard).

DDP keeps a full replica per rank and all-reduces gradients in buckets through a communication
hook (plain or compressed, parallel/compression.py), which also counts bytes and time. FSDP2
shards each decoder layer and then the root (embeddings, final norm, head) on a 1-D device
mesh: parameters, gradients and AdamW state are 1/W per rank, at the price of an all-gather per
layer in forward and backward and a reduce-scatter of its gradients. Both average gradients
over ranks; the loss function scales by the world size to keep the global mean (train/step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from sluice.train.model.causal_lm import parts
from sluice.train.parallel.clip import clipper
from sluice.train.parallel.comm_stats import CommStats
from sluice.train.parallel.dims import Parallel, ParallelDims
from sluice.train.settings import Compression


@dataclass(slots=True)
class Wrapped:
    module: torch.nn.Module  # what forward is called on
    inner: torch.nn.Module  # the *ForCausalLM inside (for its config and layers)
    stats: CommStats
    # a context for micro-batches that must not synchronise gradients yet (accumulation)
    no_sync: Callable[[], AbstractContextManager]
    fsdp_bytes_per_micro: int = 0  # FSDP2: gathered + reduced bytes per micro-batch (analytic)
    # replaces step.forward_backward: (batch, global trained tokens) -> summed loss (a pipeline)
    train_step: Callable | None = None
    # clips the gradients to the global norm and returns it (parallel/clip.py: the same arithmetic
    # in every mode, told which gradients the ranks share); None: every rank holds all, whole
    clip: Callable[[float], torch.Tensor] | None = None  # max_norm -> norm


def clip_grad_norm(model: Wrapped, max_norm: float) -> torch.Tensor:
    """Clip the gradients to `max_norm` (0: measure only); the global norm before clipping."""
    if model.clip is not None:
        return model.clip(max_norm)
    world = dist.get_world_size() if dist.is_initialized() else 1
    return clipper(model.module, plain_copies=world)(max_norm)  # one process, DDP, FSDP2's DTensors


def _fsdp_bytes(module: torch.nn.Module) -> int:
    """Bytes FSDP2 moves per micro-batch at full size: every parameter all-gathered in forward and
    backward, a trained one's gradient reduce-scattered too (a LoRA run's frozen base has none)."""
    return sum(p.numel() * p.element_size() * (3 if p.requires_grad else 2) for p in module.parameters())


def wrap(module: torch.nn.Module, dims: ParallelDims, compression: Compression, device: torch.device) -> Wrapped:
    """DDP, FSDP2 or expert parallelism over `dims.dp` ranks (one process: the module as it is)."""
    stats = CommStats()
    if dims.world == 1:
        return Wrapped(module, module, stats, nullcontext)
    if dims.parallel is Parallel.EP:
        from sluice.train.parallel.expert import wrap_expert_parallel

        ddp, clip = wrap_expert_parallel(module, compression, device, stats, dims.build_mesh(device.type))
        return Wrapped(ddp, module, stats, ddp.no_sync, clip=clip)
    if dims.parallel is Parallel.DDP:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from sluice.train.parallel.compression import register_hook

        ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
        register_hook(ddp, compression, stats)
        return Wrapped(ddp, module, stats, ddp.no_sync)
    from torch.distributed.fsdp import fully_shard

    total = _fsdp_bytes(module)
    mesh = dims.build_mesh(device.type)
    for layer in parts(module).layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    stats.timed = False
    # of the (W-1)/W shards not held: ~3·(W-1)/W of the parameters' bytes per micro-batch
    per_micro = int(total * (dims.dp - 1) / dims.dp)
    return Wrapped(module, module, stats, nullcontext, fsdp_bytes_per_micro=per_micro)
