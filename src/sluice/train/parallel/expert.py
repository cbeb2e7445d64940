"""Expert parallelism: each rank holds E/W of every MoE layer's experts; tokens travel by all_to_all.

torch has no expert-parallel API; the building block is `all_to_all_single` (it works on gloo;
the functional collectives' autograd version carries gradients back the same way). In each
MoE layer a rank groups its token assignments by expert (model/moe.py), sends each expert's rows
to the rank that owns it, runs its own experts on what arrives (from every rank), and sends the
outputs back, where they are weighted and summed per token exactly as in one process.

Everything outside the experts (attention, router, embeddings) is replicated and data-parallel
under DDP, told to leave the expert shards alone. Gradients: the loss of each rank is scaled by
W (train/step.py) so that DDP's average is the global mean; an expert's gradient is instead a
sum over the tokens every rank sent it, W times too large, so a hook divides it by W. Gradient
clipping needs the norm over all shards (parallel/clip.py, told each shard is one rank's).
Checkpoints see the shards as a DTensor sharded on dim 0 of the stack (global_views), so DCP
writes each shard once and loads them into any world size, one process included.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd

from sluice.train.model.moe import RunLocal, blocks
from sluice.train.parallel.clip import clipper
from sluice.train.parallel.comm_stats import CommStats

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.nn.parallel import DistributedDataParallel

    from sluice.train.settings import Compression


class AllToAllDispatch:
    def __init__(self, group: dist.ProcessGroup, world: int, stats: CommStats | None = None):
        self.group = group
        self.world = world
        self.rank = dist.get_rank(group)
        self.stats = stats  # counts the token bytes this rank sends to other ranks

    def __call__(self, xs: torch.Tensor, counts: torch.Tensor, run_local: RunLocal) -> torch.Tensor:
        world = self.world
        local = counts.numel() // world
        # how many rows each rank sends to each of my experts: [source rank, local expert]
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=self.group)
        recv_counts = recv_counts.view(world, local)
        send = counts.view(world, local).sum(1).tolist()
        recv = recv_counts.sum(1).tolist()
        arrived = _wait(all_to_all_single_autograd(xs.contiguous(), recv, send, self.group))
        # arrived is source-major (rank 0's rows for my experts 0..L-1, then rank 1's, ...):
        # regroup it expert-major for the grouped matmuls, and back afterwards
        order = _expert_major(recv_counts)
        out = run_local(arrived[order], recv_counts.sum(0).tolist())
        back = out[torch.argsort(order)]
        if self.stats is not None:  # rows out and outputs back, and the same again in backward
            rows = sum(send) - send[self.rank] + sum(recv) - recv[self.rank]
            self.stats.bytes += 2 * rows * xs.shape[1] * xs.element_size()
        return _wait(all_to_all_single_autograd(back.contiguous(), send, recv, self.group))


def _wait(t: torch.Tensor) -> torch.Tensor:
    # functional collectives return a tensor that completes lazily; wait before indexing it
    from torch.distributed._functional_collectives import wait_tensor

    return wait_tensor(t)


def _expert_major(counts: torch.Tensor) -> torch.Tensor:
    """Indices that reorder rows laid out source-major by `counts[source, expert]` expert-major."""
    starts = (counts.flatten().cumsum(0) - counts.flatten()).view_as(counts)
    parts = [
        torch.arange(int(starts[s, e]), int(starts[s, e] + counts[s, e]))
        for e in range(counts.shape[1])
        for s in range(counts.shape[0])
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def expert_names(module: nn.Module) -> list[str]:
    """Parameter names of the experts' stacks of every MoE layer (in `module`'s own naming)."""
    return [f"{name}.experts.{p}" for name, _ in blocks(module) for p in ("gate_up_proj", "down_proj")]


def shard_experts(
    module: nn.Module, group: dist.ProcessGroup, mesh, stats: CommStats | None = None
) -> list[nn.Parameter]:
    """Keep this rank's E/W experts of every MoE layer and route tokens with all_to_all; the
    model must be the same on every rank beforehand (it is built from the seed). Returns the
    shards' parameters."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    shards = []
    for _, block in blocks(module):
        experts = block.experts
        if experts.num_experts % world:
            raise ValueError(f"parallel = ep: {experts.num_experts} experts do not split over {world} ranks")
        per = experts.num_experts // world
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(experts, name)
            shard = nn.Parameter(full.detach()[rank * per : (rank + 1) * per].clone())
            shard.register_hook(partial(torch.div, other=world))  # a sum over W ranks' tokens → their mean
            setattr(experts, name, shard)
            shards.append(shard)
        experts.mesh = mesh
        block.dispatch = AllToAllDispatch(group, world, stats)
    return shards


def global_views(module: nn.Module, model_sd: dict, optim_sd: dict) -> None:
    """In state dicts taken with DCP's get_state_dict: show each expert shard (and its AdamW
    moments) as a DTensor sharded on dim 0, in place, so DCP saves and loads it as one tensor of
    all experts. A no-op without expert parallelism."""
    from torch.distributed.tensor import DTensor, Shard

    for name, block in blocks(module):
        mesh = block.experts.mesh
        if mesh is None:
            continue
        key = name.removeprefix("module.")  # DDP's wrapper; DCP's names are the inner module's
        for p in ("gate_up_proj", "down_proj"):
            fqn = f"{key}.experts.{p}"
            model_sd[fqn] = DTensor.from_local(model_sd[fqn], mesh, [Shard(0)], run_check=False)
            prefix = f"state.{fqn}."  # the checkpointer's flat optimizer keys (state.<fqn>.<moment>)
            for k, v in optim_sd.items():
                if k.startswith(prefix) and isinstance(v, torch.Tensor) and v.dim() > 0:
                    optim_sd[k] = DTensor.from_local(v, mesh, [Shard(0)], run_check=False)


def local_views(state: dict) -> dict:
    """The inverse of global_views after a load: every DTensor of the (nested) dict as its shard."""
    from torch.distributed.tensor import DTensor

    return {
        k: local_views(v) if isinstance(v, dict) else v.to_local() if isinstance(v, DTensor) else v
        for k, v in state.items()
    }


def wrap_expert_parallel(
    module: nn.Module, compression: Compression, device: torch.device, stats: CommStats, mesh: DeviceMesh
) -> tuple[DistributedDataParallel, Callable[[float], torch.Tensor]]:
    """Shard the experts over `mesh` (1-D, every rank), DDP the rest: the DDP module and the
    matching gradient clip."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from sluice.train.parallel.compression import register_hook

    world = dist.get_world_size()
    group = dist.new_group()  # the dispatch's own group: its collectives never queue behind DDP's buckets
    shards = shard_experts(module, group, mesh, stats)
    DDP._set_params_and_buffers_to_ignore_for_model(module, expert_names(module))
    ddp = DDP(module, device_ids=[device.index] if device.type == "cuda" else None)
    register_hook(ddp, compression, stats)  # the dense gradients; the dispatch adds its token bytes
    return ddp, clipper(module, plain_copies=world, shared={p: 1 for p in shards})
