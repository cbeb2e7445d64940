"""Wrap the full model for data parallelism: DDP (all-reduce) or FSDP2 (fully_shard).

DDP keeps a full replica per rank and all-reduces gradients in buckets through a communication
hook (plain or compressed, parallel/compression.py), which also counts bytes and time. FSDP2
shards each decoder layer and then the root (embeddings, final norm, head) on a 1-D device
mesh: parameters, gradients and AdamW state are 1/W per rank, at the price of an all-gather per
layer in forward and backward and a reduce-scatter of its gradients. Both average gradients
over ranks; the loss function scales by the world size to keep the global mean (train/step.py).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from sluice.train.parallel.comm_stats import CommStats
from sluice.train.settings import Compression, Parallel


@dataclass(slots=True)
class Wrapped:
    module: torch.nn.Module  # what forward is called on
    inner: torch.nn.Module  # the *ForCausalLM inside (for its config and layers)
    stats: CommStats
    # a context for micro-batches that must not synchronise gradients yet (accumulation)
    no_sync: Callable[[], AbstractContextManager]
    fsdp_bytes_per_micro: int = 0  # FSDP2: gathered + reduced bytes per micro-batch (analytic)
    # clips the gradients to a global norm and returns it, where torch's clip_grad_norm_ would not
    # see the whole model (expert parallelism: each rank holds other experts' gradients)
    clip: Callable[[float], torch.Tensor] | None = None


def clip_grad_norm(model: Wrapped, max_norm: float) -> torch.Tensor:
    """Clip the gradients to `max_norm` (0: measure only); the global norm before clipping."""
    if model.clip is not None:
        return model.clip(max_norm)
    return torch.nn.utils.clip_grad_norm_(model.module.parameters(), max_norm or float("inf"))


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def wrap(module: torch.nn.Module, parallel: Parallel, compression: Compression, device: torch.device) -> Wrapped:
    stats = CommStats()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return Wrapped(module, module, stats, nullcontext)
    world = dist.get_world_size()
    if parallel is Parallel.EP:
        from sluice.train.parallel.expert import wrap_expert_parallel

        ddp, clip = wrap_expert_parallel(module, compression, device, stats)
        return Wrapped(ddp, module, stats, ddp.no_sync, clip=clip)
    if parallel is Parallel.DDP:
        from torch.nn.parallel import DistributedDataParallel as DDP

        from sluice.train.parallel.compression import register_hook

        ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
        register_hook(ddp, compression, stats)
        return Wrapped(ddp, module, stats, ddp.no_sync)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    total = _param_bytes(module)
    mesh = init_device_mesh(device.type, (world,))
    for layer in module.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    stats.timed = False
    # forward all-gather + backward all-gather of the (W-1)/W shards not held, and the
    # reduce-scatter of the gradients: ~3·(W-1)/W of the parameters' bytes per micro-batch
    per_micro = int(3 * total * (world - 1) / world)
    return Wrapped(module, module, stats, nullcontext, fsdp_bytes_per_micro=per_micro)
