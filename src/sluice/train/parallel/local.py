"""This rank's part of a tensor: a DTensor's local shard (FSDP2, tensor parallelism), any other
tensor itself. Replica state, outer syncs, fault seams and byte counts read local tensors."""

from __future__ import annotations

import torch


def local_shard(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # imported where used: a plain run never builds one

    return t.to_local() if isinstance(t, DTensor) else t
