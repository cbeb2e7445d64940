"""A step's small host tensors (ids, positions, slots, tables, masks) onto the model's device.

On a GPU, `torch.tensor(list, device="cuda")` and a plain `.to("cuda")` of pageable memory both
wait for the copy, and the copy waits for the work already queued: a step built that way stalls
the host once per tensor (~8 per step) while the GPU drains. Instead the runner builds every
input on the host and `stage` copies them in one pinned, asynchronous transfer per dtype: the
host goes on to launch the forward at once, and the copies run in stream order before it.
The pinned buffers come from torch's caching host allocator, which keeps each one alive until
its copy has completed, so nothing here owns memory across steps.

The CPU path does not call this (its tensors already are where the model is).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def stage(host: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The same tensors on `device` (same shapes and dtypes), one copy per dtype."""
    out: dict[int, torch.Tensor] = {}
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(host):
        groups.setdefault(t.dtype, []).append(i)
    pin = device.type == "cuda"
    for members in groups.values():
        flat = torch.cat([host[i].reshape(-1) for i in members])
        if pin:
            flat = flat.pin_memory()
        moved = flat.to(device, non_blocking=pin)
        for i, piece in zip(members, moved.split([host[i].numel() for i in members])):
            out[i] = piece.view(host[i].shape)
    return [out[i] for i in range(len(host))]
