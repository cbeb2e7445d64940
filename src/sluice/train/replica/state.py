"""What a recovering replica group receives from a live peer: the tensors each rank holds.

Every group has the same layout (same model, same mode, same ranks per group), so rank r of one
group holds exactly the shards rank r of another holds, and torchft sends rank r's state to rank
r. The state is local tensors in parameter order (a DTensor's local shard under FSDP2), which
pickles without a device mesh and loads by copying in place: the parameters and AdamW's moments
keep their own placements. A recovering group that has not stepped yet has no AdamW state:
it is created with the parameter's placement.
"""

from __future__ import annotations

import hashlib

import torch

from sluice.train.parallel.local import local_shard


def local_state(params: list[torch.nn.Parameter], optim: torch.optim.Optimizer) -> dict:
    return {
        "params": [local_shard(p).detach() for p in params],
        "optim": [
            {k: (local_shard(v) if isinstance(v, torch.Tensor) else v) for k, v in optim.state[p].items()}
            for p in params
        ],
    }


@torch.no_grad()
def load_local_state(params: list[torch.nn.Parameter], optim: torch.optim.Optimizer, state: dict) -> None:
    if len(state["params"]) != len(params):
        raise RuntimeError(f"a peer sent {len(state['params'])} tensors for {len(params)} parameters")
    for p, t in zip(params, state["params"]):
        local_shard(p).copy_(t)
    from torch.distributed.tensor import DTensor

    for p, saved in zip(params, state["optim"]):
        mine = optim.state[p]
        for k, v in saved.items():
            if k in mine and isinstance(v, torch.Tensor):
                local_shard(mine[k]).copy_(v)
            elif isinstance(v, torch.Tensor) and isinstance(p, DTensor) and v.shape == p.to_local().shape:
                # the global shape given: FSDP2 shards unevenly (a 517-row embedding is 259 + 258)
                mine[k] = DTensor.from_local(
                    v.clone(), p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
                )
            else:
                mine[k] = v.clone() if isinstance(v, torch.Tensor) else v


def digest(params: list[torch.nn.Parameter]) -> str:
    """sha256 of this rank's parameter bytes: equal digests, equal weights bit for bit."""
    h = hashlib.sha256()
    for p in params:
        # as bytes: numpy has no bfloat16 (a bf16 run on CUDA), and fp32's bytes are the same either way
        h.update(local_shard(p).detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()
